-- permissions.lua: which of the commands sluice sends its ACL user may not run, asked once per
-- connection (sluice's prober runs it after the write probe). Nothing is run: Redis' own
-- `redis.acl_check_cmd` (Redis >= 7.0, Valkey) answers whether the user may run a command with
-- those arguments, keys and channels included, as the ACL would when the command is sent.
--
-- KEYS[1]  the probe key (under the store's prefix; it only routes the call in a Cluster)
-- ARGV     the commands to ask about, each as its word count, then its words: the command,
--          with its subcommand if any, and arguments shaped as sluice sends them (its keys under
--          the prefix, its channel)
-- returns  the positions (1-based, in ARGV's order) of the commands refused; {-1} when the server
--          cannot tell (no `redis.acl_check_cmd`: Redis < 7.0)
--
-- A command acl_check_cmd raises on (one the server does not know) counts as refused: the
-- scripts could not run it either.
if not redis.acl_check_cmd then
  return {-1}
end
local refused, at, n = {}, 1, 0
while at <= #ARGV do
  local count = tonumber(ARGV[at])
  n = n + 1
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, at + 1, at + count))
  if not ok or not allowed then
    refused[#refused + 1] = n
  end
  at = at + count + 1
end
return refused
