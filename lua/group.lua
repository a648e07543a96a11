-- group.lua: several counters decided as one atomic group: every allowed counter is recorded, or
-- none is. sluice builds the script from the three algorithm scripts' functions (the part above
-- their `sluice:entry` line) followed by this driver.
--
-- KEYS[1..n]  the counters (in a Cluster all in one hash slot, or Redis refuses the script)
-- ARGV[1]  commit     1: record the allowed counters if every enforced one allowed; 0: decide only
-- ARGV[2]  now_us     TESTS ONLY: the current time; 0 in production (read Redis `TIME`)
-- ARGV[3..]           per key, in order: kind (1 token bucket, 2 sliding log, 3 fixed window),
--                     enforce (1|0: shadow policies never block the group), cost, limit,
--                     period_us, and for a token bucket also capacity
-- returns  one {allowed (0|1), limit, remaining, reset_after_us, retry_after_us} per key, in
--          order: each decision as recorded (or as it would be)
--
-- Why one script: deciding every key and recording them in one atomic step is what makes "all
-- or nothing" hold under concurrency; TIME is read once, so every key sees the same instant.
-- TTL: each algorithm sets its own key's TTL, as in its own script.

local now, min_ttl_ms
if ARGV[2] ~= '0' then
  now, min_ttl_ms = tonumber(ARGV[2]), 60000
else
  local t = redis.call('TIME')
  now, min_ttl_ms = tonumber(t[1]) * 1000000 + tonumber(t[2]), 1
end

local specs = {}
local at = 3
for i = 1, #KEYS do
  local spec = {
    kind = tonumber(ARGV[at]),
    enforce = ARGV[at + 1] == '1',
    cost = tonumber(ARGV[at + 2]),
    limit = tonumber(ARGV[at + 3]),
    period = tonumber(ARGV[at + 4]),
  }
  at = at + 5
  if spec.kind == 1 then
    spec.capacity = tonumber(ARGV[at])
    at = at + 1
  end
  specs[i] = spec
end

local function run(i, commit)
  local s = specs[i]
  if s.kind == 1 then
    return token_bucket(KEYS[i], now, min_ttl_ms, commit, s.limit, s.period, s.capacity, s.cost)
  elseif s.kind == 2 then
    return sliding_log(KEYS[i], now, min_ttl_ms, commit, s.limit, s.period, s.cost)
  end
  return fixed_window(KEYS[i], now, min_ttl_ms, commit, s.limit, s.period, s.cost)
end

local results = {}
local pass = true
for i = 1, #KEYS do
  results[i] = run(i, false)
  if specs[i].enforce and results[i][1] == 0 then
    pass = false
  end
end
if ARGV[1] == '1' and pass then
  for i = 1, #KEYS do
    if results[i][1] == 1 then
      results[i] = run(i, true)
    end
  end
end
return results
