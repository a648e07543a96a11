-- lease.lua: quota leases, the twin of src/limit/lease.rs: take a block of units from a token
-- bucket or a fixed window (spent here before the pod admits a single one), or give back what a
-- lease did not use.
--
-- KEYS[1]  the counter key (its hash tag decides the Cluster slot)
-- KEYS[2]  the counter's lease epoch key (the counter key and `:lease-epoch`, the same slot):
--          the epoch of the counter's leases, made afresh by a take on a counter that has
--          none or that did not exist (created, reset, its data lost), and by every token
--          bucket take of units (only the latest take gives back), deleted with the counter
--          by a reset; it outlives every lease taken in it. Its value: `<epoch>:<until_us>`
-- ARGV[1]  mode       'take' or 'back'
-- ARGV[2]  algorithm  'tb' (token bucket) or 'fw' (fixed window)
-- ARGV[3]  limit      as the algorithm's script takes it
-- ARGV[4]  period_us  as the algorithm's script takes it
-- ARGV[5]  capacity   a token bucket's burst (ignored for a fixed window)
-- ARGV[6]  units      take: the most units wanted; back: the units given back
-- ARGV[7]  take: fraction, at most 1/fraction of what the counter has left is granted (>= 1);
--          0: all or nothing (a reservation): `units` if the counter has them, else none and
--          the figures of a check of `units`
--          back: a fixed window's window number the units were taken in; a token bucket's
--          instant the lease started to shrink (the take's now + hold_us)
-- ARGV[8]  take: 0; back: the epoch the take returned (units land only while it is KEYS[2]'s)
-- ARGV[9]  now_us     TESTS ONLY: the current time (the daemon sends 0: Redis `TIME`)
-- returns  take: {units, limit, remaining, reset_after_us, retry_after_us, window, hold_us, now,
--            epoch} (see Grant in src/limit/lease.rs: with 0 units the figures are a 1-unit
--            check's and the epoch 0)
--          back: {whole units given back}, 0 unless the counter's epoch is still the take's (a
--            reset, or a restart that lost the data, made the counter another one; on a token
--            bucket, any later take of units: each makes the epoch afresh); else a
--            token bucket's unused units less what the refill
--            took since the lease started to shrink, exactly (the TAT moves back by a fraction
--            of a token too), measured here on Redis' clock (a late give-back returns less,
--            never too much); 0 when there is nothing to take them into (another window,
--            another algorithm's value)
--
-- Why a script: the grant is decided on what the counter has left, in the same atomic step
-- that spends it, so that pods racing for the last units get none. Runs after state.lua and the
-- token bucket's and fixed window's functions, its entry after now.lua (`now`, from ARGV[8]).

-- The epoch in an epoch key's value `<epoch>:<until_us>` (0 when absent) and until when it is
-- kept.
local function epoch_read(epoch_key)
  local value = redis.call('GET', epoch_key)
  local epoch, until_us = string.match(value or '', '^(%d+):(%d+)$')
  return tonumber(epoch) or 0, tonumber(until_us) or 0
end

-- The counter's lease epoch for a take whose lease is held for at most `hold_ms` more: the one
-- in force, or a fresh one (`now`) when the counter did not exist before this take or has none;
-- its key lives at least as long as every lease taken in it (only GET and SET: the ACL the
-- scripts need already has them).
-- `renew`: a token bucket's lease take, whose units sit after every earlier holder's: the epoch
-- is made afresh (and stays above every earlier one), so that only the latest take's give-back
-- lands; an earlier one would move the TAT back beneath the later units, which would then be
-- counted sooner than their hold says. A reservation's take (fraction 0) keeps the epoch: its
-- units are spent when taken, as a check's are, so nothing of it is admitted later.
local function lease_epoch(epoch_key, existed, hold_ms, renew)
  local epoch, until_us = 0, 0
  if existed then
    epoch, until_us = epoch_read(epoch_key)
  end
  local ttl = math.max(min_ttl_ms, hold_ms)
  if epoch == 0 then
    epoch, until_us = now, 0
  elseif renew then
    epoch, until_us = math.max(now, epoch + 1), 0
  end
  if now + ttl * 1000 > until_us then
    redis.call('SET', epoch_key, string.format('%d:%d', epoch, now + ttl * 1000), 'PX', ttl)
  end
  return epoch
end

-- The units a take grants of `want` when the counter has `available` left: at most
-- 1/fraction of them, or (fraction 0, a reservation) all of `want` or none.
local function lease_units(want, available, fraction)
  if fraction == 0 then
    if want <= available then
      return want
    end
    return 0
  end
  return math.min(want, math.floor(available / fraction))
end

-- The cost whose figures a take that grants nothing answers: 1, or a reservation's `want`.
local function lease_asked(want, fraction)
  if fraction == 0 then
    return want
  end
  return 1
end

local function lease_take_bucket(key, limit, period, capacity, want, fraction)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  local tat_us, tat_rem = token_bucket_parse(value)
  if not tat_us or not tat_rem then
    return {err = 'BADSTATE the value is not a sluice token bucket'}
  end
  if value and string.sub(value, 1, 1) == '-' then
    -- A fixed window's live count (a reload switched algorithm; this take may have been sent
    -- before it): never overwritten by a take, which grants nothing.
    local _, cap, remaining, reset, retry = token_bucket_decide(0, 0, now, limit, period, capacity,
      lease_asked(want, fraction))
    return {0, cap, remaining, reset, retry, 0, 0, now, 0}
  end
  local ahead = math.max(0, (tat_us - now) * limit + tat_rem)
  local hold = math.floor(ahead / limit)
  local ok, _, left = token_bucket_decide(tat_us, tat_rem, now, limit, period, capacity, 0)
  local available = 0
  if ok == 1 then
    available = left
  end
  local units = lease_units(want, available, fraction)
  if units == 0 then
    local allowed, cap, remaining, reset, retry = token_bucket_decide(tat_us, tat_rem, now, limit,
      period, capacity, lease_asked(want, fraction))
    return {0, cap, remaining, reset, retry, 0, hold, now, 0}
  end
  local _, cap, remaining, reset, retry, ahead_after = token_bucket_decide(tat_us, tat_rem, now,
    limit, period, capacity, units)
  local new_us, new_rem, ttl_ms = token_bucket_after(now, min_ttl_ms, limit, ahead_after)
  redis.call('SET', key, token_bucket_format(new_us, new_rem), 'PX', ttl_ms)
  -- The lease has shrunk to nothing once its units have refilled after the hold.
  local epoch = lease_epoch(KEYS[2], value ~= nil and value ~= false,
    ceil_div(hold + ceil_div(units * period, limit), 1000) + 1, fraction ~= 0)
  return {units, cap, remaining, reset, retry, 0, hold, now, epoch}
end

local function lease_take_window(key, limit, period, want, fraction)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  local packed = fixed_window_parse(value)
  if packed == nil then
    return {err = 'BADSTATE the value is not a sluice fixed window'}
  end
  local window = math.floor(now / period)
  local hold = (window + 1) * period - now
  if value and not packed then
    -- A token bucket's live TAT (a reload switched algorithm): never overwritten by a take.
    local _, shown, remaining, reset, retry = fixed_window_decide(nil, now, min_ttl_ms, limit,
      period, lease_asked(want, fraction))
    return {0, shown, remaining, reset, retry, window, hold, now, 0}
  end
  local ok, _, left = fixed_window_decide(packed or nil, now, min_ttl_ms, limit, period, 0)
  local available = 0
  if ok == 1 then
    available = left
  end
  local units = lease_units(want, available, fraction)
  if units == 0 then
    local allowed, shown, remaining, reset, retry = fixed_window_decide(packed or nil, now,
      min_ttl_ms, limit, period, lease_asked(want, fraction))
    return {0, shown, remaining, reset, retry, window, hold, now, 0}
  end
  local _, shown, remaining, reset, retry, new_packed, ttl_ms = fixed_window_decide(packed or nil,
    now, min_ttl_ms, limit, period, units)
  redis.call('SET', key, fixed_window_format(new_packed), 'PX', ttl_ms)
  -- The units expire with their window.
  local epoch = lease_epoch(KEYS[2], value ~= nil and value ~= false, ceil_div(hold, 1000) + 1,
    false)
  return {units, shown, remaining, reset, retry, window, hold, now, epoch}
end

-- A token bucket's TAT moves back by the refill time of the unused units the lease still
-- held (those the refill has not taken since `from`), never before now (a bucket is never more
-- than full). Anything but a token bucket's value is left alone.
local function lease_back_bucket(key, limit, period, units, from)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  if not value or not string.find(value, '^%d+:?%d*$') then
    return {0}
  end
  local tat_us, tat_rem = token_bucket_parse(value)
  if not tat_us or not tat_rem then
    return {0}
  end
  -- What the lease still holds, exactly (in 1/limit us, a fraction of a token included): its
  -- unused tokens less the refill since it started to shrink. Both products stay below 2^53
  -- where it matters: units * period <= capacity * period.
  local past = math.max(0, now - from)
  if past * limit >= units * period then
    return {0}
  end
  local back = units * period - past * limit
  local ahead = math.max(0, (tat_us - now) * limit + tat_rem)
  if ahead == 0 then
    return {0}
  end
  local after = math.max(0, ahead - back)
  local new_us, new_rem, ttl_ms = token_bucket_after(now, min_ttl_ms, limit, after)
  redis.call('SET', key, token_bucket_format(new_us, new_rem), 'PX', ttl_ms)
  return {math.floor(back / period)}
end

-- A fixed window's count drops by the units if it still counts the lease's window (and the
-- window has not ended).
local function lease_back_window(key, period, units, window)
  local value = read_counter(key)
  if type(value) == 'table' then
    return value
  end
  local packed = fixed_window_parse(value)
  local tag_space = 1048576
  if not packed or packed % tag_space ~= window % tag_space or math.floor(now / period) ~= window then
    return {0}
  end
  local count = math.floor(packed / tag_space)
  local back = math.min(units, count)
  local to_next = (window + 1) * period - now
  redis.call('SET', key, fixed_window_format((count - back) * tag_space + window % tag_space), 'PX',
    math.max(min_ttl_ms, ceil_div(to_next, 1000)))
  return {back}
end

-- sluice:entry
local key, mode, algorithm = KEYS[1], ARGV[1], ARGV[2]
local limit, period, capacity = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local units, extra = tonumber(ARGV[6]), tonumber(ARGV[7])
local reply
if mode == 'back' and epoch_read(KEYS[2]) ~= tonumber(ARGV[8]) then
  -- Not the counter the units were taken from: they have nowhere to go.
  return {0}
end
if mode == 'take' and algorithm == 'tb' then
  reply = lease_take_bucket(key, limit, period, capacity, units, math.max(0, extra))
elseif mode == 'take' and algorithm == 'fw' then
  reply = lease_take_window(key, limit, period, units, math.max(0, extra))
elseif mode == 'back' and algorithm == 'tb' then
  reply = lease_back_bucket(key, limit, period, units, extra)
elseif mode == 'back' and algorithm == 'fw' then
  reply = lease_back_window(key, period, units, extra)
else
  return redis.error_reply('BADARGS lease mode ' .. tostring(mode) .. ' for ' .. tostring(algorithm))
end
if reply.err then
  return redis.error_reply(reply.err .. ' [item 1]')
end
return reply
