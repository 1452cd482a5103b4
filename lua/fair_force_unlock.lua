-- Fair lock: delete the lock whoever holds it (PROTOCOL 4 force unlock).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset
-- ARGV[1] publish command, ARGV[2] release channel of this lock
--
-- Reply: 1 when a lock was deleted (and the head, if any, was told), 0 when there was none.

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local publish_cmd, channel_prefix = ARGV[1], ARGV[2]

if redis.call('DEL', name) == 1 then
  wake_head(queue, deadlines, liveness, publish_cmd, channel_prefix)
  return 1
end
return 0
