-- fixed_window.lua: fixed window counter, the twin of src/limit/fixed_window.rs.
--
-- KEYS[1]  the counter key: the negative integer -(count * 2^20 + (window index mod 2^20)), kept
--          by Redis as an integer object (the smallest value it stores); negative so that it can
--          never be taken for a token bucket's TAT (a positive integer) after a policy changed
--          algorithm. Releases before this layout wrote it positive: such a value still reads as
--          a fixed window when below 2^50 (a count below 2^30; a TAT is above 2^50 since 2005)
-- ARGV[1]  limit      most units per window (integer >= 1)
-- ARGV[2]  period_us  the window length in microseconds; windows are aligned to multiples of it
--                     since the epoch, so every pod agrees on them (integer >= 1)
-- ARGV[3]  cost       units this request spends (integer >= 1; 0 with commit 0 reads the
--                     state: what `GET /v1/counters` shows)
-- ARGV[4]  commit     1: record the request if allowed; 0: decide only (dry run)
-- ARGV[5]  now_us     TESTS ONLY: the current time; the daemon never sends it (Redis `TIME`)
-- returns  {allowed (0|1), limit, remaining, reset_after_us, retry_after_us}
--          retry_after_us is -1 when cost > limit (never admissible)
--
-- Calendar windows (`calendar: true`: local days, weeks or months) never come through this entry
-- point: the daemon sends them to batch.lua (kind CALENDAR_WINDOW), whose items carry, in place of
-- period_us, four boundaries b1 < b2 < b3 < b4 (us since the epoch) the daemon computed around its
-- own clock: three windows [b1, b2), [b2, b3), [b3, b4). Redis' `now` picks the one that holds it
-- (the store's clock decides the window; a `now` in none of them fails the check: CLOCK). The
-- window's tag is its start in minutes since the epoch, mod 2^20 (two windows of one calendar
-- start at least 23 hours apart, and 2^20 minutes are about two years).
--
-- Why a script: reading the count and adding to it must be one atomic step. The window's identity
-- is kept in the value (not the key name) so that the script touches only the key it was given; a
-- count from an earlier window counts as 0. The number is the window's under the policy's
-- period, so a reload that changes the period is a window boundary (as in the Rust twin). Its
-- low 20 bits suffice: a key lives one window, so
-- it can only be confused with one 2^20 windows old. Up to 2 * limit can pass across a boundary: the
-- documented price of the cheapest algorithm.
-- With the test-only now_us, TTLs are at least a minute: real time keeps running while test time
-- stands still, and state must not expire under a test (expiry never changes a decision).
-- TTL: the key expires at the end of its window.
-- Another algorithm's value (a token bucket's TAT, a sliding log's sorted set in the batch
-- script) reads as absent: the policy changed algorithm, its partitions start afresh. A value
-- that is no sluice state is refused (BADSTATE).
--
-- Runs after state.lua (bounded readers, the clock), its entry point after now.lua (`now` and
-- `min_ttl_ms`, from ARGV[5]). Everything above the `sluice:entry` line is also used by batch.lua;
-- the daemon sends a batch of one check of one counter as a call of this script itself (the lean
-- path: none of the batch's bookkeeping).

-- The stored value as the packed number, false when absent or another algorithm's (a token
-- bucket's "<tat>" or "<tat>:<rem>"), nil when it is no sluice state. Exact: at most 16 digits.
local function fixed_window_parse(value)
  if not value then
    return false
  end
  if #value <= 17 and string.find(value, '^%-%d+$') then
    return -tonumber(value)
  end
  if #value <= 16 and string.find(value, '^%d+$') then
    local packed = tonumber(value)
    if packed < 1125899906842624 then
      return packed
    end
    return false
  end
  local sep = string.find(value, ':', 1, true)
  if sep and sep <= 17 and #value - sep <= 10 and string.find(value, '^%d+:%d+$') then
    return false
  end
  return nil
end

local function fixed_window_format(packed)
  return '-' .. string.format('%d', packed)
end

-- The window holding `now`: its tag (the low 20 bits of its number) and the us from `now` to its
-- end. `period` is a length (windows aligned to its multiples since the epoch) or a calendar's
-- four boundaries (see the header); nil when `now` is in none of a calendar's windows.
local function fixed_window_span(now, period)
  if type(period) == 'table' then
    for i = 1, 3 do
      if period[i] <= now and now < period[i + 1] then
        return math.floor(period[i] / 60000000) % 1048576, period[i + 1] - now
      end
    end
    return nil
  end
  local window = math.floor(now / period)
  return window % 1048576, (window + 1) * period - now
end

-- One decision, pure, on the stored number `packed` (nil when absent): allowed (0|1), limit,
-- remaining, reset_after_us, retry_after_us, and when allowed the new packed value and its TTL in
-- ms (the end of the window). A calendar's `period` must hold `now` (fixed_window_span).
local function fixed_window_decide(packed, now, min_ttl_ms, limit, period, cost)
  local tag_space = 1048576
  local tag, to_next = fixed_window_span(now, period)
  local count = 0
  if packed and packed % tag_space == tag then
    count = math.floor(packed / tag_space)
  end

  if count + cost <= limit then
    local reset = to_next
    if count + cost == 0 then
      reset = 0
    end
    return 1, limit, limit - count - cost, reset, 0, (count + cost) * tag_space + tag,
      math.max(min_ttl_ms, ceil_div(to_next, 1000))
  end

  local reset = 0
  if count > 0 then
    reset = to_next
  end
  local retry = -1
  if cost <= limit then
    retry = to_next
  end
  -- A count above the limit is a lowered limit's (a reload): none left, never a negative figure.
  return 0, limit, math.max(0, limit - count), reset, retry, nil, nil
end

-- A spend regardless past the window's limit (batch commit 2, a report): the packed value that
-- counts the limit (every later check in the window is denied, as with the whole cost counted;
-- nothing carries into the next window) and its TTL. The twin of FixedWindow::spend.
local function fixed_window_full(packed, now, min_ttl_ms, limit, period)
  local tag_space = 1048576
  local tag, to_next = fixed_window_span(now, period)
  local count = 0
  if packed and packed % tag_space == tag then
    count = math.floor(packed / tag_space)
  end
  return math.max(count, limit) * tag_space + tag, math.max(min_ttl_ms, ceil_div(to_next, 1000))
end

-- One check of the counter `key` on its own: read, decide, and with `commit` write. Returns the
-- five figures, or an error reply (a key of the wrong type, or holding no sluice fixed window).
-- A sliding log's sorted set reads as absent (read_counter), like the batch script does. This
-- script's entry point and the batch script's lean loop run it.
local function fixed_window_check(key, commit, limit, period, cost, now, min_ttl_ms)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  local packed = fixed_window_parse(value)
  if packed == nil then
    return {err = 'BADSTATE the value is not a sluice fixed window'}
  end
  local allowed, shown_limit, remaining, reset, retry, new_packed, ttl_ms = fixed_window_decide(
    packed or nil, now, min_ttl_ms, limit, period, cost)
  if new_packed and commit then
    redis.call('SET', key, fixed_window_format(new_packed), 'PX', ttl_ms)
  end
  return {allowed, shown_limit, remaining, reset, retry}
end

-- sluice:entry
local reply = fixed_window_check(KEYS[1], ARGV[4] == '1', tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), now, min_ttl_ms)
if reply.err then
  return redis.error_reply(reply.err .. ' [item 1]')
end
return reply
