-- reservation.lua: a reservation's settle mark (see src/check/reservations.rs). A reservation
-- spends its estimate when it is made (a lease take of all or nothing, lua/lease.lua); settling
-- it gives back or spends the difference once: this script decides, in one atomic step on
-- Redis' clock, whether a settle is the first, so any pod may settle any pod's reservation and
-- a second settle changes nothing. A reservation never settled needs nothing: it settled at its
-- estimate, which was spent when it was made.
--
-- KEYS[1]  the mark key: the reservation's first counter key and `:rsv:<id>` (the counter's
--          hash tag, so the partition's Cluster slot)
-- ARGV[1]  expires_us  the reservation's end on Redis' clock (its take's `now` plus the
--          policy's reservation_ttl)
-- ARGV[2]  now_us      TESTS ONLY: the current time (the daemon sends 0: Redis `TIME`)
-- returns  {0}: the first settle (marked settled until expires_us); {1}: settled before;
--          {2}: expired (now >= expires_us): nothing to settle, nothing marked
--
-- Commands: SET (NX PX), the ACL the other scripts need. Runs after state.lua, its entry after
-- now.lua (`now`).

-- sluice:entry
local expires = tonumber(ARGV[1])
if not expires or now >= expires then
  return {2}
end
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', math.max(1, ceil_div(expires - now, 1000))) then
  return {0}
end
return {1}
