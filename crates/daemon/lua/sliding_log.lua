-- sliding_log.lua: sliding window log, the twin of src/limit/sliding_log.rs.
--
-- KEYS[1]  the counter key: a sorted set, one member per run of admitted units (see below),
--          scored by its time in us
-- ARGV[1]  limit      most units in any rolling period (integer >= 1)
-- ARGV[2]  period_us  the window length in microseconds (integer >= 1)
-- ARGV[3]  cost       units this request spends, recorded as one run (integer >= 1; 0 with
--                     commit 0 reads the state: what `GET /v1/counters` shows)
-- ARGV[4]  commit     1: record the request if allowed; 0: decide only (dry run)
-- ARGV[5]  now_us     TESTS ONLY: the current time; the daemon never sends it (Redis `TIME`)
-- returns  {allowed (0|1), limit, remaining, reset_after_us, retry_after_us}
--          retry_after_us is -1 when cost > limit (never admissible)
--
-- Why a script: counting the window and adding the new entries must be one atomic step, or two
-- pods would both see room for the last unit. Rejected attempts are never recorded.
--
-- A unit at score ts is in the window at `now` iff ts > now - period.
--
-- Runs: the work of a call must not grow with its cost (a report of 1,000,000 units once wrote
-- 10,000 members), so a commit writes one member, a run of `cost` units at its time (merged into
-- the newest run when that has the same time, as the Rust twin merges), named by the negative
-- integer -(cum * 2^15 + cost) (integer-looking, so Redis packs it as an integer, small while
-- the log is young): `cum` counts the units recorded up to and including this run (mod 2^24,
-- more than a window ever holds: at most 2 * 10,000 units), so names are unique among live runs.
-- The units in the window are the newest run's cum minus the oldest live run's cum before it: two
-- O(log n) reads whatever the costs. Every member in between is a run: runs are only ever added
-- at the top (the newest time), and so are legacy members (below), which a call rewrites first.
-- Finding the unit a wait or a trim depends on is a binary search over ranks, O(log^2 n).
-- Legacy members: any other member (what this script wrote before runs, one member per unit,
-- named by the decimal of (ts mod 2*period), with ".<n>" or a "t<ts>.<n>" fallback) counts one
-- unit. A window holding one fails the count check, and any call (a dry run too: the units stay
-- the same) first rewrites the legacy members as runs, one per distinct time: those above the
-- newest run, where a pod of the previous version adds them during a rolling upgrade (so O(what
-- it added since the last call)), or, if that is not enough, the whole window once (at most
-- 10,000 members, the bound state.lua enforces). A pod of the previous version counts each run
-- as one unit: see docs/policies.md.
-- Members are never built with tostring() (it prints 14 significant digits; times have 16).
-- With the test-only now_us, TTLs are at least a minute: real time keeps running while test time
-- stands still, and state must not expire under a test (expiry never changes a decision).
-- TTL: the set expires when its newest unit leaves the window.
--
-- Runs after state.lua (bounded readers, the clock) and token_bucket.lua's functions (which know
-- the other algorithms' values), its entry point after now.lua (`now` and `min_ttl_ms`, from
-- ARGV[5]). Everything above the `sluice:entry` line is also used by batch.lua; the daemon sends a
-- batch of one check of one counter as a call of this script itself (the lean path: none of the
-- batch's bookkeeping).

-- A run member's moduli: cum and cost (their product is 2^39: doubles stay exact).
local LOG_CUM, LOG_COST = 16777216, 32768

-- A member as a run: {cost, cum}, or nil for a legacy member (one unit).
local function log_run(member)
  if string.byte(member, 1) ~= 45 or not string.find(member, '^%-%d+$') then
    return nil
  end
  local n = tonumber(string.sub(member, 2))
  if not n or n >= LOG_CUM * LOG_COST then
    return nil
  end
  local cost = n % LOG_COST
  if cost == 0 then
    return nil
  end
  return {cost = cost, cum = math.floor(n / LOG_COST)}
end

-- The member naming a run.
local function log_member(cost, cum)
  return '-' .. string.format('%d', cum * LOG_COST + cost)
end

-- Rewrites `members` (a flat WITHSCORES reply, oldest first, already removed from the key) as
-- runs, one per distinct time, continuing the chain after `cum`; returns the newest time.
-- ZADD takes up to 256 runs a call.
local function log_rewrite(key, members, cum)
  local at, units, args = nil, 0, {}
  for i = 1, #members / 2 + 1 do
    local ts = members[2 * i]
    if at and ts ~= at then
      cum = (cum + units) % LOG_CUM
      args[#args + 1], args[#args + 2] = at, log_member(units, cum)
      units = 0
      if #args == 512 or not ts then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if ts then
      local run = log_run(members[2 * i - 1])
      at, units = ts, units + (run and run.cost or 1)
    end
  end
  return tonumber(at)
end

-- The window of `key` at `floor` (exclusive) as a view: m members, `units` in them, the newest
-- member's time `newest_ts` and run `last`, and at(i): the i-th member from the oldest (1-based)
-- as {ts, run, upto (the units of members 1..i)}, read by rank.
--
-- A window holding legacy members (or runs whose chain they broke) is first rewritten as runs,
-- one per distinct time (units unchanged): the members above the newest run, which is where a pod
-- of the previous version adds them (O(what it added since)); if the chain is still broken, the
-- whole window, once (at most 10,000 members). Either way every later call is O(log n) again.
local function log_view(key, floor, cut, now, period, min_ttl_ms, rewrites)
  local v = {m = redis.call('ZCOUNT', key, floor, '+inf'), units = 0}
  if v.m == 0 then
    return v
  end
  local newest = redis.call('ZRANGE', key, '+inf', floor, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  local oldest = redis.call('ZRANGE', key, floor, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  local last, first = log_run(newest[1]), log_run(oldest[1])
  -- Each run holds at least a unit: fewer units than members is no chain of runs.
  if not (last and first and (last.cum - first.cum + first.cost) % LOG_CUM >= v.m) then
    rewrites = (rewrites or 0) + 1
    if rewrites > 2 then
      error('BADSTATE the sorted set cannot be read as a sliding log')
    end
    local members, cum = {}, 0
    if rewrites == 1 and not last then
      -- From the newest member down to the newest run (bounded by the window's m members).
      -- By rank (the window is the set's top m ranks), 64 a page: O(log n) a page.
      local down, found = {}, false
      for offset = 0, v.m - 1, 64 do
        local page = redis.call('ZRANGE', key, -math.min(offset + 64, v.m), -(offset + 1), 'WITHSCORES')
        for i = #page - 1, 1, -2 do
          down[#down + 1], down[#down + 2] = page[i], page[i + 1]
          local run = log_run(page[i])
          if run then
            cum, found = (run.cum - run.cost) % LOG_CUM, true
            break
          end
        end
        if found then
          break
        end
      end
      for i = #down - 1, 1, -2 do
        members[#members + 1], members[#members + 2] = down[i], down[i + 1]
      end
      redis.call('ZREMRANGEBYRANK', key, -(#members / 2), -1)
    else
      members = redis.call('ZRANGE', key, floor, '+inf', 'BYSCORE', 'WITHSCORES')
      redis.call('ZREMRANGEBYSCORE', key, floor, '+inf')
    end
    local newest_ts = log_rewrite(key, members, cum)
    redis.call('PEXPIRE', key, math.max(min_ttl_ms, ceil_div(newest_ts + period - now, 1000)))
    return log_view(key, floor, cut, now, period, min_ttl_ms, rewrites)
  end
  local base = first.cum - first.cost
  v.newest_ts, v.last, v.units = tonumber(newest[2]), last, (last.cum - base) % LOG_CUM
  local skipped
  v.at = function(i)
    if i == 1 then
      return {ts = tonumber(oldest[2]), run = first, upto = first.cost}
    elseif i == v.m then
      return {ts = v.newest_ts, run = last, upto = v.units}
    end
    skipped = skipped or redis.call('ZCOUNT', key, '-inf', cut)
    local got = redis.call('ZRANGE', key, skipped + i - 1, skipped + i - 1, 'WITHSCORES')
    local run = log_run(got[1])
    return {ts = tonumber(got[2]), run = run, upto = (run.cum - base) % LOG_CUM}
  end
  return v
end

-- The first member (from the oldest) by which `units` units of the window have passed: its
-- position and itself.
local function log_reaching(v, units)
  local found = v.at(1)
  if found.upto >= units then
    return 1, found
  end
  local lo, hi = 2, v.m
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if v.at(mid).upto >= units then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo, v.at(lo)
end

-- Records a run of `cost` units at `ts` on the view's key (expired members already removed, so
-- the view's newest member is the set's last rank): merged into the newest run if it has that
-- time (a run then holds at most 2 * 10,000 units: within LOG_COST), else the chain's next run.
local function log_record(key, v, ts, cost)
  local last = v.last
  if last and v.newest_ts == ts then
    redis.call('ZREMRANGEBYRANK', key, -1, -1)
    redis.call('ZADD', key, string.format('%d', ts),
      log_member(last.cost + cost, (last.cum + cost) % LOG_CUM))
    return
  end
  local chain = last or {cum = 0}
  redis.call('ZADD', key, string.format('%d', ts),
    log_member(cost, (chain.cum + cost) % LOG_CUM))
end

-- Keeps only the newest `limit` units of the key's window (`floor`, `cut`), all of them live:
-- drops the oldest members whole and shortens the run the cut falls in.
local function log_keep(key, floor, cut, limit, now, period, min_ttl_ms)
  local v = log_view(key, floor, cut, now, period, min_ttl_ms)
  if v.units <= limit then
    return
  end
  local excess = v.units - limit
  local i, at = log_reaching(v, excess)
  local kept = at.upto - excess
  -- Ranks 0 .. i-2 go whole; then `at` is rank 0.
  local before = i - 1
  if before > 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, before - 1)
  end
  if kept == 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, 0)
  elseif at.run and kept < at.run.cost then
    redis.call('ZREMRANGEBYRANK', key, 0, 0)
    redis.call('ZADD', key, string.format('%d', at.ts), log_member(kept, at.run.cum))
  end
end

-- Not a pure function of numbers like the other algorithms' decide functions: a log is not a few
-- numbers, so this one reads the set itself (ZCOUNT, ZRANGE) and, with `commit`, writes it
-- (ZREMRANGEBYSCORE, ZADD, ZREMRANGEBYRANK, PEXPIRE) in the same call. Callers that decide
-- several keys as one check (the batch script) must therefore decide every counter with `commit`
-- false first and call it with `commit` true only once all of them fit (a report, which is not
-- all or nothing, commits each at once).
--
-- `absent`: decide as if the key held no log, without reading it (the batch script passes it
-- for a dry run on a key holding another algorithm's value, which a commit deletes first).
-- `spend` (batch commit 2, a report): record the units even past the limit, then keep only the
-- newest `limit` units (later checks of cost >= 1 depend on no others) and answer a cost-1
-- read of the new state. The twin of SlidingLog::spend.
local function sliding_log(key, now, min_ttl_ms, commit, limit, period, cost, absent, spend)
  local floor, cut = '(' .. string.format('%d', now - period), string.format('%d', now - period)
  local v = {m = 0, units = 0}
  if not absent then
    v = log_view(key, floor, cut, now, period, min_ttl_ms)
  end
  local used, newest_ts = v.units, v.newest_ts

  local fits = used + cost <= limit
  if fits or (spend and commit) then
    -- A clock that stepped back adds to the newest entry's time, as the Rust twin does.
    local ts = now
    if newest_ts and newest_ts > now then
      ts = newest_ts
    end
    if commit then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
      if cost > 0 then
        log_record(key, v, ts, math.min(cost, limit))
      end
      if not fits then
        log_keep(key, floor, cut, limit, now, period, min_ttl_ms)
      end
      redis.call('PEXPIRE', key, math.max(min_ttl_ms, ceil_div(ts + period - now, 1000)))
    end
    if not fits then
      return sliding_log(key, now, min_ttl_ms, false, limit, period, 1, false)
    end
    -- A read (cost 0) adds no unit: the quota is full once the newest unit leaves the window.
    local reset = 0
    if cost > 0 then
      reset = ts + period - now
    elseif newest_ts then
      reset = newest_ts + period - now
    end
    return {1, limit, limit - used - cost, reset, 0}
  end

  local reset = 0
  if newest_ts then
    reset = newest_ts + period - now
  end
  local retry = -1
  if cost <= limit then
    -- The request fits once the oldest `excess` units have left the window.
    local _, oldest = log_reaching(v, used + cost - limit)
    retry = oldest.ts + period - now
  end
  -- More used than the limit is a lowered limit's (a reload): none left, never a negative figure.
  return {0, limit, math.max(0, limit - used), reset, retry}
end

-- One check of the counter `key` on its own: returns the five figures, or an error reply (a
-- key of the wrong type, or holding no sluice value); raises what `sliding_log` raises. A string
-- holding a token bucket's or fixed window's value (token_bucket_parse knows both) is another
-- algorithm's (the policy changed algorithm): read as absent and deleted by a commit, like the
-- batch script does. Anything else fails the check after bounded work. This script's entry point
-- and the batch script's lean loop run it.
local function sliding_log_check(key, commit, limit, period, cost, now, min_ttl_ms)
  local stale = false
  local failed = log_bound(key)
  if failed then
    if not string.find(failed.err, 'WRONGTYPE', 1, true) then
      return failed
    end
    local value = read_string(key)
    if type(value) == 'table' then
      return value
    end
    if not token_bucket_parse(value) then
      return {err = 'BADSTATE the value is not a sluice sliding log'}
    end
    stale = true
    if commit then
      redis.call('DEL', key)
    end
  end
  return sliding_log(key, now, min_ttl_ms, commit, limit, period, cost, stale and not commit)
end

-- sluice:entry
-- Every write permission first (refused_write, state.lua): none of the check is written without.
local refused = refused_write(KEYS[1], SLIDING_LOG_WRITES)
if refused then
  return redis.error_reply(refused.err .. ' [item 1]')
end
local reply = sliding_log_check(KEYS[1], ARGV[4] == '1', tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), now, min_ttl_ms)
if reply.err then
  return redis.error_reply(reply.err .. ' [item 1]')
end
return reply
