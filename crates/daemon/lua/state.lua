-- state.lua: reading a key's stored state within bounds, shared by every script sluice runs
-- (composed in front of each algorithm script and of the batch script; it has no entry point).
--
-- Why bounded reads: a key under sluice's prefix may hold anything (another tool's value, a
-- policy's old algorithm, a huge sorted set). Reading it costs O(1) whatever it holds, so a
-- foreign key fails only its own check and never holds up Redis or the rest of a batch.

-- What a sluice value can be: a sorted set holds at most this many members (a sliding log's
-- limit is at most 10,000 by config bound, and each commit drops what left the window), a string
-- fewer bytes than this. A key beyond either is not sluice's: it fails its own check (BADSTATE)
-- after O(1) work, never O(members) or O(bytes) that would hold up the rest of the batch.
local max_log_members, max_value_bytes, last_byte = 10000, 64, '63'

-- A string key's value, at most max_value_bytes read: false when absent (or empty: sluice never
-- writes one), or an error reply (WRONGTYPE for another type, BADSTATE when too long). An ACL
-- from before GETRANGE was used refuses it: then the value is read whole with GET.
local function read_string(key)
  local value = redis.pcall('GETRANGE', key, '0', last_byte)
  if type(value) == 'table' and not string.find(value.err, 'WRONGTYPE', 1, true) then
    value = redis.pcall('GET', key)
  end
  if type(value) == 'table' then
    return value
  end
  if not value or value == '' then
    return false
  end
  if #value >= max_value_bytes then
    return {err = 'BADSTATE the value is longer than any sluice state'}
  end
  return value
end

-- Whether the key's sorted set is within a sliding log's bound: nil if so, else an error reply
-- (WRONGTYPE when it is no sorted set either). ZCOUNT over every score costs O(log n), like ZCARD
-- (which the documented ACL does not grant).
local function log_bound(key)
  local members = redis.pcall('ZCOUNT', key, '-inf', '+inf')
  if type(members) == 'table' then
    return members
  end
  if members > max_log_members then
    return {err = 'BADSTATE the sorted set holds more members than a sluice log'}
  end
  return nil
end

-- A token bucket's or fixed window's stored string, as read_string gives it, except that a sorted
-- set within a sliding log's bound reads as absent (false): the policy changed algorithm, its
-- partitions start afresh. An error reply for anything else.
local function read_counter(key)
  local value = read_string(key)
  if type(value) == 'table' then
    if not string.find(value.err, 'WRONGTYPE', 1, true) then
      return value
    end
    return log_bound(key) or false
  end
  return value
end

-- a / b rounded up, for non-negative integers a and b >= 1 (every algorithm rounds waits and TTLs
-- up with it).
local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- The commands a sliding log writes with (its trim, its run, its TTL, a report's overspend, the
-- value of another algorithm it replaces), each with arguments its key is found in.
local SLIDING_LOG_WRITES = {
  {'ZREMRANGEBYSCORE', '0', '0'}, {'ZADD', '0', 'm'}, {'PEXPIRE', '1'},
  {'ZREMRANGEBYRANK', '0', '0'}, {'DEL'},
}

-- Whether the script's user may run each of `commands` (as SLIDING_LOG_WRITES lists them) on
-- `key`: nil, or an error reply naming the first it may not (as Redis names a refused command,
-- so sluice logs and counts it as it does a refusal by Redis inside a script: that call's checks
-- alone fail, the circuit stays closed). A call that writes with several
-- commands asks first, so that a permission taken away refuses it before anything is written: a
-- sliding log without +pexpire once kept its ZADD and answered a failure mode. Redis >= 7.0 can
-- tell (redis.acl_check_cmd); older servers cannot, and rely on sluice's probe at connect.
local function refused_write(key, commands)
  if not redis.acl_check_cmd then
    return nil
  end
  for _, command in ipairs(commands) do
    local args = {command[1], key}
    for i = 2, #command do
      args[#args + 1] = command[i]
    end
    local ok, allowed = pcall(redis.acl_check_cmd, unpack(args))
    if ok and not allowed then
      return {err = "NOPERM the script's user has no permissions to run the '" ..
        string.lower(command[1]) .. "' command (asked before writing)"}
    end
  end
  return nil
end
