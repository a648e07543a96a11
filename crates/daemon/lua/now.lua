-- now.lua: the first lines of every entry point (sluice composes it after state.lua and the
-- functions, in front of batch.lua and of each algorithm script's part below its `sluice:entry`
-- line, writing the position of that script's test-only `now_us` argument in place of $NOW_ARGV).
-- The time every decision of the call uses, in us, and the least TTL a write gets: Redis' own
-- clock (one TIME per call, so every pod shares it), or, for tests only, `now_us` (an integer
-- other than 0; then TTLs are at least a minute: real time keeps running while test time stands
-- still, and state must not expire under a test; expiry never changes a decision). Inline, not a
-- function: Lua creates each `local function` as a closure on every call of a script.
local now, min_ttl_ms
do
  local test_now = ARGV[$NOW_ARGV]
  if test_now and test_now ~= '' and test_now ~= '0' then
    now, min_ttl_ms = tonumber(test_now), 60000
  else
    local t = redis.call('TIME')
    now, min_ttl_ms = tonumber(t[1]) * 1000000 + tonumber(t[2]), 1
  end
end
