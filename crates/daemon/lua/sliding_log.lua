-- sliding_log.lua: sliding window log, the twin of src/limit/sliding_log.rs.
--
-- KEYS[1]  the counter key: a sorted set, one member per admitted unit, scored by its time in us
-- ARGV[1]  limit      most units in any rolling period (integer >= 1)
-- ARGV[2]  period_us  the window length in microseconds (integer >= 1)
-- ARGV[3]  cost       units this request spends; recorded as that many members (integer >= 1;
--                     0 with commit 0 reads the state: what `GET /v1/counters` shows)
-- ARGV[4]  commit     1: record the request if allowed; 0: decide only (dry run)
-- ARGV[5]  now_us     TESTS ONLY: the current time; the daemon never sends it (Redis `TIME`)
-- returns  {allowed (0|1), limit, remaining, reset_after_us, retry_after_us}
--          retry_after_us is -1 when cost > limit (never admissible)
--
-- Why a script: counting the window and adding the new entries must be one atomic step, or two
-- pods would both see room for the last unit. Rejected attempts are never recorded.
--
-- A unit at score ts is in the window at `now` iff ts > now - period. Members need only be unique
-- among live members: the decimal (ts mod 2*period), so distinct live times never share one (and
-- Redis packs an integer-looking member as an integer), with ".<n>" for the n-th unit at the same
-- time. ZADD NX proves it; if a clock step ever made a name
-- clash, the unit falls back to the full time "t<ts>.<n>", which cannot clash. Members are never
-- built with tostring() (it prints 14 significant digits; times have 16).
-- With the test-only now_us, TTLs are at least a minute: real time keeps running while test time
-- stands still, and state must not expire under a test (expiry never changes a decision).
-- TTL: the set expires when its newest unit leaves the window.
--
-- Runs after state.lua (bounded readers, the clock) and token_bucket.lua's functions (which know
-- the other algorithms' values), its entry point after now.lua (`now` and `min_ttl_ms`, from
-- ARGV[5]). Everything above the `sluice:entry` line is also used by batch.lua; the daemon sends a
-- batch of one check of one counter as a call of this script itself (the lean path: none of the
-- batch's bookkeeping).

-- Not a pure function of numbers like the other algorithms' decide functions: a log is not a few
-- numbers, so this one reads the set itself (ZCOUNT, ZRANGE) and, with `commit`, writes it
-- (ZREMRANGEBYSCORE, ZADD, PEXPIRE) in the same call. Callers that decide several keys as one
-- check (the batch script) must therefore decide every counter with `commit` false first and call
-- it with `commit` true only once all of them fit (a report, which is not all or nothing, commits
-- each at once).
--
-- `absent`: decide as if the key held no log, without reading it (the batch script passes it
-- for a dry run on a key holding another algorithm's value, which a commit deletes first).
-- `spend` (batch commit 2, a report): record the units even past the limit, then keep only the
-- newest `limit` members (later checks of cost >= 1 depend on no others) and answer a cost-1
-- read of the new state. The twin of SlidingLog::spend.
local function sliding_log(key, now, min_ttl_ms, commit, limit, period, cost, absent, spend)
  local floor = '(' .. string.format('%d', now - period)
  local used, newest_ts = 0, nil
  if not absent then
    used = redis.call('ZCOUNT', key, floor, '+inf')
    local newest = redis.call('ZRANGE', key, '+inf', floor, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    if newest[2] then
      newest_ts = tonumber(newest[2])
    end
  end

  local fits = used + cost <= limit
  if fits or (spend and commit) then
    -- A clock that stepped back adds to the newest entry's time, as the Rust twin does.
    local ts = now
    if newest_ts and newest_ts > now then
      ts = newest_ts
    end
    if commit then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - period))
      local score = string.format('%d', ts)
      local at_ts = redis.call('ZCOUNT', key, score, score)
      local short = string.format('%d', ts % (2 * period))
      for i = at_ts + 1, at_ts + math.min(cost, limit) do
        local member = short
        if i > 1 then
          member = short .. '.' .. i
        end
        if redis.call('ZADD', key, 'NX', score, member) == 0 then
          redis.call('ZADD', key, score, 't' .. score .. '.' .. i)
        end
      end
      if not fits then
        redis.call('ZREMRANGEBYRANK', key, 0, -(limit + 1))
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
    local excess = used + cost - limit
    local oldest = redis.call('ZRANGE', key, floor, '+inf', 'BYSCORE', 'LIMIT', excess - 1, 1, 'WITHSCORES')
    retry = tonumber(oldest[2]) + period - now
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
