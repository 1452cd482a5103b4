-- Baseline for benches/contended.rs: the layout floor's release (layout_release.lua) made to run
-- the commands FairLock's release runs when it hands the lock to a queued head (PROTOCOL 8): the
-- compare-and-set read, the head read before the lock is freed, the head's liveness mark, the
-- server clock, its grant request read and dropped, its mark dropped. 13 commands where the
-- floor runs 7; see layout_plus_acquire.lua.
--
-- KEYS[1] owner hash, KEYS[2] waiter list, KEYS[3] deadline set, KEYS[4] liveness set,
-- KEYS[5] grant requests hash
-- ARGV[1] owner field, ARGV[2] lease ms, ARGV[3] channel prefix (the head's field is appended)
-- Reply: 1 handed over, 0 freed, -1 not the owner.

local owner, queue, deadlines, liveness, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, prefix = ARGV[1], ARGV[2], ARGV[3]

if not redis.call('HGET', owner, me) then
  return -1
end
local head = redis.call('LINDEX', queue, 0)
redis.call('DEL', owner)
if not head then
  return 0
end
redis.call('ZSCORE', liveness, head)
redis.call('TIME')
redis.call('HGET', grants, head)
redis.call('LPOP', queue)
redis.call('ZREM', deadlines, head)
redis.call('ZREM', liveness, head)
redis.call('HDEL', grants, head)
redis.call('HSET', owner, head, 1)
redis.call('PEXPIRE', owner, lease)
redis.call('PUBLISH', prefix .. head, '0')
return 1
