-- batch.lua: every check of one batch in one call. sluice builds the script from state.lua, the
-- three algorithm scripts' functions (the part above their `sluice:entry` line), now.lua (`now`
-- and `min_ttl_ms`, from ARGV[1]) and this driver.
-- A batch of one check of one counter goes out as its algorithm's own script instead (cheaper);
-- a batch whose checks have one counter each, each counter once, runs the lean loop (ARGV[3]).
--
-- KEYS[1..n]  the batch's counters, each once (in a Cluster: all in one hash slot), or none in a
--             Cluster node call: then the counters are ARGV[3..] (several slots of one node; the
--             node script's `allow-cross-slot-keys` flag allows that on Redis >= 7.0)
-- ARGV[1]     now_us   TESTS ONLY: the current time; 0 in production (read Redis `TIME`, once)
-- ARGV[2]     the checks, in arrival order, as one MessagePack array of integers (unpacked in C:
--             far cheaper than tonumber on each field); each check is
--               items (>= 1), commit (1: record; 0: dry run; 2: spend every item whatever its
--               decision, a report), then per item: key (index into
--               KEYS), kind (1 token bucket, 2 sliding log, 3 fixed window, 4 calendar window),
--               enforce (1|0: shadow policies never block), cost, limit, period_us, and for a
--               token bucket capacity and most_ahead (the furthest a report may put its TAT past
--               now, in 1/limit us: the policy's report debt bound, at most 2^52; see
--               TokenBucket::max_ahead); a calendar window has, in place of period_us, four
--               boundaries b1 < b2 < b3 < b4 (fixed_window.lua): a fixed window on the
--               calendar window among them that holds `now`, or the error CLOCK when none does
-- ARGV[3]     '1': lean: every check has one item, no counter is in two checks and none is a
--             report, so each check runs as its algorithm's own script would (its `_check`
--             function: read, decide, write at once), without the bookkeeping below; absent
--             otherwise (never in a node call, whose ARGV[3..] are counters)
-- returns     one flat array, the checks in order: each check's items' figures {allowed (0|1),
--             limit, remaining, reset_after_us, retry_after_us} (5 integers per item), or one
--             error reply for that check alone (a key of the wrong type, holding a foreign
--             value or beyond a sluice value's size fails only its own check), ending with
--             " [item <n>]": the check's item whose key it is. sluice knows each check's items,
--             so an error entry or 5 integers per item tells where the next check begins.
--
-- Why one script: a batch costs Redis one call, one TIME and one read of the request instead of
-- one of each per check. A check of several items (the policies of one request) is all or
-- nothing: every allowed item is recorded only if every enforced item allowed, exactly as group
-- checks are in the embedded store.
-- Same key, one read and one write: token bucket and fixed window states are read at their first
-- use, kept as numbers while the checks run in order (each sees what the one before it wrote, as
-- if they had arrived one by one at the same instant), and written once at the end. The sliding
-- log's state is a sorted set of units; it is read and written in place.
-- TTL: each written key gets the TTL its algorithm gives for its last recorded check.
-- Policy changes: a key holding another algorithm's value (the policy changed algorithm on a
-- reload) reads as absent, so its partition starts afresh under the new one; formats are told
-- apart exactly (sorted set: sliding log; "<tat>[:<rem>]": token bucket; negative integer: fixed
-- window). Anything else fails its own check.

-- The packed checks' numbers, named as sluice's encoder names them (src/store/redis/scripts.rs,
-- whose test reads these three lines back): a check's commit values, an item's algorithm kinds,
-- and how many integers an item takes (a token bucket's two more: its capacity and most_ahead) and a check's
-- head (items, commit); a calendar window's item is ITEM_WIDTH + 3 (three more boundaries).
local DRY_RUN, RECORD, REPORT = 0, 1, 2
local TOKEN_BUCKET, SLIDING_LOG, FIXED_WINDOW, CALENDAR_WINDOW = 1, 2, 3, 4
local ITEM_WIDTH, BUCKET_WIDTH, HEAD_WIDTH = 6, 8, 2

local spec = cmsgpack.unpack(ARGV[2])

-- How many integers an item of `kind` takes.
local function width(kind)
  if kind == TOKEN_BUCKET then
    return BUCKET_WIDTH
  elseif kind == CALENDAR_WINDOW then
    return ITEM_WIDTH + 3
  end
  return ITEM_WIDTH
end

-- The `period` fixed_window.lua's functions take for the item at spec[at] of `kind`: its
-- period_us, or a calendar window's four boundaries.
local function period_of(at, kind)
  if kind == CALENDAR_WINDOW then
    return {spec[at + 5], spec[at + 6], spec[at + 7], spec[at + 8]}
  end
  return spec[at + 5]
end

-- The error of a calendar window item whose boundaries do not hold `now` (nil otherwise): the
-- daemon's clock and Redis' disagree by more than a window.
local function off_calendar(at, kind)
  if kind == CALENDAR_WINDOW and not fixed_window_span(now, period_of(at, kind)) then
    return {err = 'CLOCK the store clock is outside the calendar windows sent'}
  end
  return nil
end

local keys, node_call = KEYS, #KEYS == 0
if node_call then
  keys = {}
  for i = 3, #ARGV do
    keys[i - 2] = ARGV[i]
  end
end

-- A call holding a sliding log asks for its write permissions (and SET's, which the other
-- algorithms write with at the end) before anything is written: a permission taken away refuses
-- every check of the call, each with the refusal, instead of leaving some writes behind
-- (refused_write, state.lua).
do
  local at, log_key, commands = 1, nil, SLIDING_LOG_WRITES
  while at <= #spec do
    local count = spec[at]
    at = at + HEAD_WIDTH
    for _ = 1, count do
      local kind = spec[at + 1]
      if kind == SLIDING_LOG then
        log_key = log_key or keys[spec[at]]
      elseif commands == SLIDING_LOG_WRITES then
        commands = {{'SET', 'v'}}
        for _, command in ipairs(SLIDING_LOG_WRITES) do
          commands[#commands + 1] = command
        end
      end
      at = at + width(kind)
    end
  end
  local refused = log_key and refused_write(log_key, commands)
  if refused then
    local results, n = {}, 0
    at = 1
    while at <= #spec do
      local count = spec[at]
      at = at + HEAD_WIDTH
      for _ = 1, count do
        at = at + width(spec[at + 1])
      end
      n = n + 1
      results[n] = redis.error_reply(refused.err)
    end
    return results
  end
end

-- The lean loop: one counter per check, each counter once (ARGV[3]). With no counter shared,
-- "as if one by one" needs no state kept across checks: each check is its algorithm's own script.
-- A raised error (a sliding log's command) fails its own check only, as below.
if ARGV[3] == '1' and not node_call then
  local results, n, at = {}, 0, 1
  while at <= #spec do
    local commit, key, kind = spec[at + 1] == RECORD, KEYS[spec[at + 2]], spec[at + 3]
    local cost, limit, period = spec[at + 5], spec[at + 6], spec[at + 7]
    local ok, reply
    if kind == TOKEN_BUCKET then
      ok, reply = true, token_bucket_check(key, commit, limit, period, spec[at + 8], cost, now,
        min_ttl_ms)
      at = at + HEAD_WIDTH + BUCKET_WIDTH
    elseif kind == SLIDING_LOG then
      ok, reply = pcall(sliding_log_check, key, commit, limit, period, cost, now, min_ttl_ms)
      at = at + HEAD_WIDTH + ITEM_WIDTH
    else
      local item = at + HEAD_WIDTH
      reply = off_calendar(item, kind)
      ok, reply = true, reply or fixed_window_check(key, commit, limit, period_of(item, kind),
        cost, now, min_ttl_ms)
      at = item + width(kind)
    end
    if not ok then
      results[n + 1] = redis.error_reply(type(reply) == 'table' and reply.err or reply)
      n = n + 1
    elseif reply.err then
      results[n + 1] = redis.error_reply(reply.err .. ' [item 1]')
      n = n + 1
    else
      results[n + 1], results[n + 2], results[n + 3], results[n + 4], results[n + 5] =
        reply[1], reply[2], reply[3], reply[4], reply[5]
      n = n + 5
    end
  end
  return results
end

-- Per key index: the algorithm kind it is held as in this batch (a policy that changed algorithm
-- can meet the key under both kinds in one batch: its checks then run as if one by one), its
-- state once read (token bucket: a, b = tat_us, tat_rem; fixed window: a = packed count, false
-- when absent), an error reply if it cannot be read, whether a sliding log finds another
-- algorithm's value there (`stale`: read as absent, deleted by its first commit), and the TTL of
-- the last recorded check (token bucket and fixed window keys are written at the end).
local held, a, b, bad, stale, ttls = {}, {}, {}, {}, {}, {}

-- The reply, one flat array (nested arrays cost Redis far more to convert): see the header.
local results = {}

-- Writes a token bucket or fixed window key's kept state, if a check recorded one.
local function write(k)
  local ttl_ms = ttls[k]
  if not ttl_ms then
    return
  end
  ttls[k] = nil
  local value
  if held[k] == TOKEN_BUCKET then
    value = token_bucket_format(a[k], b[k])
  else
    value = fixed_window_format(a[k])
  end
  redis.call('SET', keys[k], value, 'PX', ttl_ms)
end

-- Holds key k as `kind` from here on: a key held as another kind so far has its recorded state
-- written first, so that this check reads what the one before it left, as one by one.
local function hold(k, kind)
  if held[k] == kind then
    return false
  end
  if held[k] then
    write(k)
  end
  held[k], a[k], b[k], bad[k], stale[k] = kind, nil, nil, nil, nil
  return true
end

-- Reads key k as a TOKEN_BUCKET or FIXED_WINDOW once; returns its error reply, if any.
-- A sorted set within the log bound is a sliding log's (the policy changed algorithm): absent.
local function load(k, kind)
  if not hold(k, kind) then
    return bad[k]
  end
  local value = read_counter(keys[k])
  if type(value) == 'table' then
    bad[k] = value
    return value
  end
  if kind == TOKEN_BUCKET then
    a[k], b[k] = token_bucket_parse(value)
    if not a[k] or not b[k] then
      bad[k] = {err = 'BADSTATE the value is not a sluice token bucket'}
    end
  else
    a[k] = fixed_window_parse(value)
    if a[k] == nil then
      bad[k] = {err = 'BADSTATE the value is not a sluice fixed window'}
    end
  end
  return bad[k]
end

-- Checks key k as a sliding log once; returns its error reply, if any. A string holding a token
-- bucket's or fixed window's value (token_bucket_parse knows both) is `stale`: read as absent.
local function load_log(k)
  if not hold(k, SLIDING_LOG) then
    return bad[k]
  end
  local failed = log_bound(keys[k])
  if failed and string.find(failed.err, 'WRONGTYPE', 1, true) then
    local value = read_string(keys[k])
    if type(value) == 'table' then
      failed = value
    elseif token_bucket_parse(value) then
      failed, stale[k] = nil, true
    else
      failed = {err = 'BADSTATE the value is not a sluice sliding log'}
    end
  end
  bad[k] = failed
  return failed
end

-- Decides the item at spec[at] (kind `kind`), its 5 figures written to results[n + 1 .. n + 5];
-- for a token bucket or fixed window also returns what recording it needs. A sliding log's
-- failure (its commands raise) returns nil and the failure. `spend`: a report's (see spend()).
local function decide(at, kind, n, commit, spend)
  local k, cost, limit, period = spec[at], spec[at + 3], spec[at + 4], period_of(at, kind)
  if kind == SLIDING_LOG then
    if stale[k] and commit then
      redis.call('DEL', keys[k])
      stale[k] = nil
    end
    local ok, reply = pcall(sliding_log, keys[k], now, min_ttl_ms, commit, limit, period, cost,
      stale[k], spend)
    if not ok then
      return nil, reply
    end
    results[n + 1], results[n + 2], results[n + 3], results[n + 4], results[n + 5] =
      reply[1], reply[2], reply[3], reply[4], reply[5]
    return reply[1]
  end
  local allowed, after1, after2
  if kind == TOKEN_BUCKET then
    allowed, results[n + 2], results[n + 3], results[n + 4], results[n + 5], after1 =
      token_bucket_decide(a[k], b[k], now, limit, period, spec[at + 6], cost)
  else
    allowed, results[n + 2], results[n + 3], results[n + 4], results[n + 5], after1, after2 =
      fixed_window_decide(a[k] or nil, now, min_ttl_ms, limit, period, cost)
  end
  results[n + 1] = allowed
  return allowed, after1, after2
end

-- Records an allowed token bucket or fixed window item in the kept state.
local function record(at, kind, after1, after2)
  local k = spec[at]
  if kind == TOKEN_BUCKET then
    a[k], b[k], ttls[k] = token_bucket_after(now, min_ttl_ms, spec[at + 4], after1)
  else
    a[k], ttls[k] = after1, after2
  end
end

-- Runs the check whose `count` items start at spec[first], its figures written from
-- results[n + 1] on; returns nothing, or its failure (an error reply, or a sliding log's raised
-- message).
local function check(first, count, commit, n)
  local at = first
  for i = 1, count do
    local kind = spec[at + 1]
    local failed
    if kind == SLIDING_LOG then
      failed = load_log(spec[at])
    else
      failed = off_calendar(at, kind) or load(spec[at], kind)
    end
    if failed then
      -- Which item failed, for the daemon's warn line (the message never names the key).
      return {err = failed.err .. ' [item ' .. i .. ']'}
    end
    at = at + width(kind)
  end
  if count == 1 then
    local kind = spec[first + 1]
    local allowed, after1, after2 = decide(first, kind, n, commit)
    if allowed == nil then
      return after1
    end
    if commit and allowed == 1 and kind ~= SLIDING_LOG then
      record(first, kind, after1, after2)
    end
    return nil
  end
  -- Several items: decide all, then record the allowed ones only if no enforced one denied.
  local pass, afters = true, {}
  at = first
  for i = 1, count do
    local kind = spec[at + 1]
    local allowed, after1, after2 = decide(at, kind, n + 5 * (i - 1), false)
    if allowed == nil then
      return after1
    end
    afters[2 * i - 1], afters[2 * i] = after1, after2
    if spec[at + 2] == 1 and allowed == 0 then
      pass = false
    end
    at = at + width(kind)
  end
  if commit and pass then
    at = first
    for i = 1, count do
      local kind = spec[at + 1]
      local m = n + 5 * (i - 1)
      if results[m + 1] == 1 then
        if kind == SLIDING_LOG then
          local allowed, failure = decide(at, kind, m, true)
          if allowed == nil then
            return failure
          end
        else
          record(at, kind, afters[2 * i - 1], afters[2 * i])
        end
      end
      at = at + width(kind)
    end
  end
  return nil
end

-- Spends every item of the check whatever its decision (commit REPORT: a report, the cost known only
-- afterwards), its figures written from results[n + 1] on: one within its limit is recorded as a
-- check's; one past it records its algorithm's overspend and reports a cost-1 read of the new
-- state. Items are independent (nothing is refused, so nothing is all or nothing). Returns
-- nothing, or its failure as check() does.
local function spend(first, count, n)
  local at = first
  for i = 1, count do
    local kind, failed = spec[at + 1], nil
    if kind == SLIDING_LOG then
      failed = load_log(spec[at])
    else
      failed = off_calendar(at, kind) or load(spec[at], kind)
    end
    if failed then
      return {err = failed.err .. ' [item ' .. i .. ']'}
    end
    at = at + width(kind)
  end
  at = first
  for i = 1, count do
    local kind = spec[at + 1]
    local k, cost, limit, period = spec[at], spec[at + 3], spec[at + 4], period_of(at, kind)
    local m = n + 5 * (i - 1)
    local allowed, after1, after2 = decide(at, kind, m, true, true)
    if allowed == nil then
      return after1
    end
    if kind ~= SLIDING_LOG and allowed == 1 then
      record(at, kind, after1, after2)
    elseif kind ~= SLIDING_LOG then
      local _
      if kind == TOKEN_BUCKET then
        local ahead = token_bucket_debt(a[k], b[k], now, limit, period, cost, spec[at + 7])
        a[k], b[k], ttls[k] = token_bucket_after(now, min_ttl_ms, limit, ahead)
        _, results[m + 2], results[m + 3], results[m + 4], results[m + 5] =
          token_bucket_decide(a[k], b[k], now, limit, period, spec[at + 6], 1)
      else
        a[k], ttls[k] = fixed_window_full(a[k] or nil, now, min_ttl_ms, limit, period)
        _, results[m + 2], results[m + 3], results[m + 4], results[m + 5] =
          fixed_window_decide(a[k], now, min_ttl_ms, limit, period, 1)
      end
    end
    at = at + width(kind)
  end
  return nil
end

-- A node call was grouped by sluice's copy of the slot map, which a resharding can make stale:
-- every key must be served here, and that is checked before anything is written (a script that
-- touches another node's key fails mid-way, after its earlier writes). Every key is read (or its
-- log bound checked) now instead of at first use: no extra command. sluice resends a refused call
-- one call per slot.
if node_call then
  local at = 1
  while at <= #spec do
    local count = spec[at]
    at = at + HEAD_WIDTH
    for _ = 1, count do
      local k, kind = spec[at], spec[at + 1]
      local failed
      if kind == SLIDING_LOG then
        failed = load_log(k)
      else
        failed = load(k, kind)
      end
      if type(failed) == 'table' and failed.err and string.find(failed.err, 'Script attempted', 1, true) then
        return redis.error_reply('NONLOCAL ' .. failed.err)
      end
      at = at + width(kind)
    end
  end
end

local at, n = 1, 0
while at <= #spec do
  local count, commit = spec[at], spec[at + 1]
  local first = at + HEAD_WIDTH
  at = first
  for _ = 1, count do
    at = at + width(spec[at + 1])
  end
  local failure
  if commit == REPORT then
    failure = spend(first, count, n)
  else
    failure = check(first, count, commit == RECORD, n)
  end
  if failure then
    -- The check's one entry is its error; figures it had written go (the reply stays contiguous).
    for i = n + 2, n + 5 * count do
      results[i] = nil
    end
    -- A sliding log's raised message arrives as a string; a Redis error as {err = ...}.
    results[n + 1] = redis.error_reply(type(failure) == 'table' and failure.err or failure)
    n = n + 1
  else
    n = n + 5 * count
  end
end

for k in pairs(held) do
  write(k)
end
return results
