-- now.lua: the first line of every entry point (sluice composes it after state.lua and the
-- functions, in front of batch.lua and of each algorithm script's part below its `sluice:entry`
-- line, writing the position of that script's test-only `now_us` argument in place of $NOW_ARGV):
-- the time every decision of the call uses and the least TTL a write gets (see clock()).
local now, min_ttl_ms = clock(ARGV[$NOW_ARGV])
