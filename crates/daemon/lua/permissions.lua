-- permissions.lua: which of the commands sluice sends its ACL user may not run, asked once per
-- connection (sluice's prober runs it after the write probe). Redis >= 7.0 (and Valkey) answer
-- through `redis.acl_check_cmd`, which runs nothing: whether the user may run a command with
-- those arguments, keys and channels included, as the ACL would when the command is sent.
-- Redis 6.2 has no such function: there the commands the scripts call (and HGET) are run with
-- `redis.pcall` on the probe key (a throwaway string the write probe just set: the sorted-set
-- commands meet WRONGTYPE after the ACL let them through, the others read it, expire it, set it
-- and delete it), and a refusal is told by its words; the daemon's own commands that a script
-- may not call (EVALSHA, SCRIPT, PUBLISH, SUBSCRIBE, CLUSTER, ROLE) are not asked there.
--
-- KEYS[1]  the probe key (under the store's prefix; it also routes the call in a Cluster)
-- ARGV     the commands to ask about, each as its word count, then its words: the command,
--          with its subcommand if any, and arguments shaped as sluice sends them (its keys under
--          the prefix, its channel)
-- returns  the positions (1-based, in ARGV's order) of the commands refused
--
-- A command acl_check_cmd raises on (one the server does not know) counts as refused: the
-- scripts could not run it either.
local check = redis.acl_check_cmd
local callable = {time = true, getrange = true, get = true, zcount = true, zrange = true,
  zremrangebyscore = true, zremrangebyrank = true, zadd = true, pexpire = true, set = true,
  del = true, hget = true}
local refused, at, n = {}, 1, 0
while at <= #ARGV do
  local count = tonumber(ARGV[at])
  n = n + 1
  if check then
    local ok, allowed = pcall(check, unpack(ARGV, at + 1, at + count))
    if not ok or not allowed then
      refused[#refused + 1] = n
    end
  elseif callable[ARGV[at + 1]] then
    local reply = redis.pcall(unpack(ARGV, at + 1, at + count))
    if type(reply) == 'table' and reply.err and string.find(reply.err, "can't run this command", 1, true) then
      refused[#refused + 1] = n
    end
  end
  at = at + count + 1
end
return refused
