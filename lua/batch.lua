-- batch.lua: every check of one batch in one call. sluice builds the script from the three
-- algorithm scripts' functions (the part above their `sluice:entry` line) followed by this driver.
--
-- KEYS[1..n]  the batch's counters, each once (in a Cluster: all in one hash slot)
-- ARGV[1]     now_us   TESTS ONLY: the current time; 0 in production (read Redis `TIME`, once)
-- ARGV[2]     checks   how many checks follow, in arrival order; each is
--               items (>= 1), commit (1: record; 0: dry run), then per item: key (index into
--               KEYS), kind (1 token bucket, 2 sliding log, 3 fixed window), enforce (1|0: shadow
--               policies never block), cost, limit, period_us, and for a token bucket capacity
-- returns     one entry per check, in order: either one {allowed (0|1), limit, remaining,
--             reset_after_us, retry_after_us} per item, or an error reply for that check alone
--             (a key of the wrong type or holding a foreign value fails only its own check)
--
-- Why one script: a batch costs Redis one call and one TIME instead of one per check. A check of
-- several items (the policies of one request) is all or nothing: every allowed item is recorded
-- only if every enforced item allowed, exactly as group checks are in the embedded store.
-- Same key, one read and one write: token bucket and fixed window values are read at their first
-- use, kept in `values` while the checks run in order (each sees what the one before it wrote,
-- as if they had arrived one by one at the same instant), and written once at the end with the
-- last TTL. The sliding log's state is a sorted set of units; it is read and written in place.
-- TTL: each key's TTL is the one its algorithm gives for its last recorded check.

local now, min_ttl_ms
if ARGV[1] ~= '0' then
  now, min_ttl_ms = tonumber(ARGV[1]), 60000
else
  local t = redis.call('TIME')
  now, min_ttl_ms = tonumber(t[1]) * 1000000 + tonumber(t[2]), 1
end

local values = {}   -- key index -> value (false: absent), once read
local ttls = {}     -- key index -> TTL in ms of the last write, for keys to write at the end

local function value_of(k)
  local value = values[k]
  if value == nil then
    value = redis.call('GET', KEYS[k])
    values[k] = value
  end
  return value
end

-- One item: its reply, and for a token bucket or fixed window the value to keep (when recorded).
local function run(item, commit)
  local k, kind = item[1], item[2]
  if kind == 1 then
    return token_bucket_step(value_of(k), now, min_ttl_ms, commit, item[5], item[6], item[7], item[4])
  elseif kind == 2 then
    return sliding_log(KEYS[k], now, min_ttl_ms, commit, item[5], item[6], item[4])
  end
  return fixed_window_step(value_of(k), now, min_ttl_ms, commit, item[5], item[6], item[4])
end

local function keep(item, value, ttl_ms)
  if value then
    values[item[1]] = value
    ttls[item[1]] = ttl_ms
  end
end

-- Runs one check; raises on a bad key (its caller turns that into this check's error).
local function check(items, commit)
  local replies = {}
  if #items == 1 then
    local reply, value, ttl_ms = run(items[1], commit)
    keep(items[1], value, ttl_ms)
    replies[1] = reply
    return replies
  end
  local pass = true
  for i = 1, #items do
    replies[i] = run(items[i], false)
    if items[i][3] == 1 and replies[i][1] == 0 then
      pass = false
    end
  end
  if commit and pass then
    for i = 1, #items do
      if replies[i][1] == 1 then
        local reply, value, ttl_ms = run(items[i], true)
        keep(items[i], value, ttl_ms)
        replies[i] = reply
      end
    end
  end
  return replies
end

local results = {}
local at = 3
for c = 1, tonumber(ARGV[2]) do
  local count, commit = tonumber(ARGV[at]), ARGV[at + 1] == '1'
  at = at + 2
  local items = {}
  for i = 1, count do
    local kind = tonumber(ARGV[at + 1])
    local width = 6
    if kind == 1 then
      width = 7
    end
    local item = {}
    for f = 1, width do
      item[f] = tonumber(ARGV[at + f - 1])
    end
    items[i] = item
    at = at + width
  end
  local ok, replies = pcall(check, items, commit)
  if ok then
    results[c] = replies
  elseif type(replies) == 'table' and replies.err then
    results[c] = {err = replies.err}
  else
    -- error('BADSTATE ...') arrives as "user_script:<line>: BADSTATE ..."; keep the code first.
    local message = 'ERR unexpected script error'
    if type(replies) == 'string' then
      message = replies
    end
    local code_at = string.find(message, 'BADSTATE', 1, true)
    if code_at then
      message = string.sub(message, code_at)
    end
    results[c] = {err = message}
  end
end

for k, ttl_ms in pairs(ttls) do
  redis.call('SET', KEYS[k], values[k], 'PX', ttl_ms)
end
return results
