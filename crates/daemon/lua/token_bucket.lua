-- token_bucket.lua: GCRA token bucket, the twin of src/limit/token_bucket.rs.
--
-- KEYS[1]  the counter key (its hash tag decides the Cluster slot; no other key is touched)
-- ARGV[1]  limit      tokens added per period (integer >= 1)
-- ARGV[2]  period_us  the period in microseconds (integer >= 1)
-- ARGV[3]  capacity   burst: most tokens held at once (integer >= 1)
-- ARGV[4]  cost       tokens this request spends (integer >= 1; 0 with commit 0 reads the
--                     state: what `GET /v1/counters` shows)
-- ARGV[5]  commit     1: record the request if allowed; 0: decide only (dry run)
-- ARGV[6]  now_us     TESTS ONLY: the current time; the daemon never sends it, so every pod
--                     shares Redis' clock (`TIME`)
-- returns  {allowed (0|1), limit (= capacity), remaining, reset_after_us, retry_after_us}
--          retry_after_us is -1 when cost > capacity (never admissible)
--
-- Why a script: read, decide and write must be one atomic step, or two pods reading the same
-- state would both spend the last token.
--
-- State: the theoretical arrival time TAT = tat_us + tat_rem / limit microseconds, stored as
-- "<tat_us>:<tat_rem>", or as the bare integer "<tat_us>" when tat_rem is 0 (Redis then keeps it
-- as an integer object: less memory; always so when period_us is a multiple of limit). Another
-- algorithm's value (after a policy changed algorithm) reads as a full bucket; a value that is
-- no sluice state at all is refused (BADSTATE), and so is one longer than any sluice state (the
-- read is bounded: GETRANGE of 64 bytes).
-- Arithmetic runs in units of 1/limit us relative to now, so every value stays an exact integer
-- below 2^53 (config keeps capacity * period_us <= 2^52); Lua numbers are doubles, and floor()
-- of an exact quotient below 2^53 is exact.
-- With the test-only now_us, TTLs are at least a minute: real time keeps running while test time
-- stands still, and state must not expire under a test (expiry never changes a decision).
-- TTL: the key expires when the bucket is full again (TAT), as an absent key means "full".
--
-- Runs after state.lua (bounded readers, the clock), its entry point after now.lua (`now` and
-- `min_ttl_ms`, from ARGV[6]). Everything above the `sluice:entry` line is also used by batch.lua;
-- the daemon sends a batch of one check of one counter as a call of this script itself (the lean
-- path: none of the batch's bookkeeping).

-- The stored value as numbers: TAT = tat_us + tat_rem / limit. An absent key is (0, 0), a full
-- bucket, and so is a fixed window's value (a negative integer, see fixed_window.lua): the policy
-- changed algorithm, its partitions start afresh. nil for anything else (not sluice's). The
-- format check is exact: only digits, at most 16 for the time (us until the year 2286) and 10
-- for the remainder (below limit <= 10^9), so a foreign number cannot pose as a far TAT.
local function token_bucket_parse(value)
  if not value then
    return 0, 0
  end
  -- Cheapest test first: a plain find, then one anchored pattern per part (a pattern with a
  -- capture before `:` backtracks over every digit of a bare TAT).
  local sep = string.find(value, ':', 1, true)
  if not sep then
    if #value <= 16 and string.find(value, '^%d+$') then
      return tonumber(value), 0
    end
    if #value <= 17 and string.find(value, '^%-%d+$') then
      return 0, 0
    end
    return nil, nil
  end
  local tat, rem = string.sub(value, 1, sep - 1), string.sub(value, sep + 1)
  if #tat <= 16 and #rem <= 10 and string.find(tat, '^%d+$') and string.find(rem, '^%d+$') then
    return tonumber(tat), tonumber(rem)
  end
  return nil, nil
end

-- One decision, pure, on numbers: allowed (0|1), limit (= capacity), remaining, reset_after_us,
-- retry_after_us, and when allowed `ahead_after`, the new TAT's distance from now in 1/limit us.
local function token_bucket_decide(tat_us, tat_rem, now, limit, period, capacity, cost)
  -- ahead: how far TAT is past now, in 1/limit us (0 when the bucket is full). A tat_rem of
  -- `limit` or more (written under a higher limit, before a reload) carries into tat_us, as in
  -- the Rust twin. Exact when TAT is near now; far behind it, the sign alone matters.
  local ahead = (tat_us - now) * limit + tat_rem
  if ahead < 0 then
    ahead = 0
  end

  local tolerance = capacity * period
  local ahead_after = ahead + cost * period
  if ahead_after <= tolerance then
    return 1, capacity, capacity - ceil_div(ahead_after, period), ceil_div(ahead_after, limit), 0,
      ahead_after
  end

  local remaining = 0
  if tolerance > ahead then
    remaining = math.floor((tolerance - ahead) / period)
  end
  local retry = -1
  if cost <= capacity then
    retry = ceil_div(ahead - (capacity - cost) * period, limit)
  end
  return 0, capacity, remaining, ceil_div(ahead, limit), retry, nil
end

-- The state after an admission `ahead_after` past now: tat_us, tat_rem and the key's TTL in ms
-- (the bucket is full again at TAT).
local function token_bucket_after(now, min_ttl_ms, limit, ahead_after)
  return now + math.floor(ahead_after / limit), ahead_after % limit,
    math.max(min_ttl_ms, ceil_div(ahead_after, limit * 1000))
end

-- A spend regardless past what the bucket holds (batch commit 2, a report): the new TAT's
-- distance from now in 1/limit us, `cost` tokens further into debt, at most `most` (the policy's
-- report debt bound as sluice computes it, never above 2^52: exact in doubles; rounding is
-- monotonic, so a product beyond it still compares above it), never back.
-- The twin of TokenBucket::spend.
local function token_bucket_debt(tat_us, tat_rem, now, limit, period, cost, most)
  local ahead = math.max(0, (tat_us - now) * limit + tat_rem)
  return math.max(ahead, math.min(ahead + cost * period, most))
end

local function token_bucket_format(tat_us, tat_rem)
  if tat_rem > 0 then
    return string.format('%d', tat_us) .. ':' .. string.format('%d', tat_rem)
  end
  return string.format('%d', tat_us)
end

-- One check of the counter `key` on its own: read, decide, and with `commit` write. Returns the
-- five figures, or an error reply (a key of the wrong type, or holding no sluice token bucket).
-- A sliding log's sorted set reads as absent (read_counter), like the batch script does. This
-- script's entry point and the batch script's lean loop (one counter per check, each counter
-- once) run it.
local function token_bucket_check(key, commit, limit, period, capacity, cost, now, min_ttl_ms)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  local tat_us, tat_rem = token_bucket_parse(value)
  if not tat_us or not tat_rem then
    return {err = 'BADSTATE the value is not a sluice token bucket'}
  end
  local allowed, cap, remaining, reset, retry, ahead_after = token_bucket_decide(tat_us, tat_rem,
    now, limit, period, capacity, cost)
  if ahead_after and commit then
    local ttl_ms
    tat_us, tat_rem, ttl_ms = token_bucket_after(now, min_ttl_ms, limit, ahead_after)
    redis.call('SET', key, token_bucket_format(tat_us, tat_rem), 'PX', ttl_ms)
  end
  return {allowed, cap, remaining, reset, retry}
end

-- sluice:entry
local reply = token_bucket_check(KEYS[1], ARGV[5] == '1', tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]), now, min_ttl_ms)
if reply.err then
  return redis.error_reply(reply.err .. ' [item 1]')
end
return reply
