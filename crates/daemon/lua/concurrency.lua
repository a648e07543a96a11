-- concurrency.lua: concurrency limits, the twin of src/limit/concurrency.rs: the permits a
-- partition holds, a sorted set whose members are the permits' ids, each scored by the instant
-- (in us, on Redis' clock) it expires at. A permit is held while now < its score.
--
-- KEYS[1]  the partition's key (its hash tag decides the Cluster slot): a sorted set
-- ARGV[1]  mode       'acquire' (take a permit if fewer than `limit` are held), 'peek' (the
--                     same decision, nothing taken: a dry run) or 'release' (give one back)
-- ARGV[2]  limit      the most permits held at once (acquire, peek)
-- ARGV[3]  ttl_us     how long a permit is held unless released (acquire, peek)
-- ARGV[4]  permit     the permit's id, 32 hex digits (acquire, release)
-- ARGV[5]  now_us     TESTS ONLY: the current time (the daemon sends 0: Redis `TIME`)
-- returns  acquire, peek: {allowed (1 or 0), limit, remaining, reset_after_us, retry_after_us,
--            expired} (a Decision's figures as the Rust twin computes them: remaining after this
--            admission, reset when the last permit held expires (at least ttl_us when allowed),
--            retry when the earliest expires), and the permits that had expired (dropped here)
--          release: {released (1: the permit was held and its slot is back; 0: released
--            already, expired or never taken), expired}
--
-- Commands: ZREMRANGEBYSCORE, ZCOUNT, ZRANGE, ZADD, PEXPIRE (the ACL the other scripts need).
-- A release without ZREM: `ZADD XX CH` moves the permit's score to 0 (1 only if it was held),
-- then `ZREMRANGEBYSCORE 0 0` drops it. Runs after state.lua, its entry after now.lua (`now`).

-- The score of the permit at `rank` (0 the earliest, -1 the latest), or nil.
local function permit_score(key, rank)
  local got = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return got[2] and tonumber(got[2]) or nil
end

-- sluice:entry
local key, mode = KEYS[1], ARGV[1]
local counted = redis.pcall('ZCOUNT', key, '-inf', '+inf')
if type(counted) == 'table' then
  return counted
end
if counted > max_log_members then
  return {err = 'BADSTATE the sorted set holds more members than a sluice permit set'}
end
local expired = redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
if mode == 'release' then
  local released = redis.call('ZADD', key, 'XX', 'CH', '0', ARGV[4])
  if released > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '0', '0')
  end
  return {released, expired}
end
local limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local held = counted - expired
local last = permit_score(key, -1)
local last_after = last and (last - now) or 0
if held < limit then
  if mode == 'acquire' then
    local expires = now + ttl
    redis.call('ZADD', key, string.format('%d', expires), ARGV[4])
    local until_us = math.max(expires, last or 0)
    redis.call('PEXPIRE', key, math.max(min_ttl_ms, ceil_div(until_us - now, 1000)))
  end
  return {1, limit, limit - held - 1, math.max(last_after, ttl), 0, expired}
end
local first = permit_score(key, 0)
return {0, limit, 0, last_after, first - now, expired}
