-- Fair lock: delete the lock whoever holds it (PROTOCOL 4 force unlock), then hand it on
-- (`pass_on`: a direct grant to a fairlock head that asked for one, otherwise the head is told).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset,
-- KEYS[5] grant requests hash, KEYS[6] fencing counter
-- ARGV[1] publish command, ARGV[2] release channel of this lock
--
-- Reply: 1 when a lock was deleted (and handed on), 0 when there was none.

local k = {name = KEYS[1], queue = KEYS[2], deadlines = KEYS[3], liveness = KEYS[4],
  grants = KEYS[5], token = KEYS[6]}
local publish_cmd, channel_prefix = ARGV[1], ARGV[2]

if redis.call('DEL', k.name) == 1 then
  pass_on(k, publish_cmd, channel_prefix)
  return 1
end
return 0
