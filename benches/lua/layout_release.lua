-- Baseline for benches/contended.rs: the release of the layout floor (see layout_acquire.lua).
-- With somebody queued, the lock goes straight to the head of the list (its owner field replaces
-- ours, with a fresh lease) and the head is told on its own channel, as Redisson's per-waiter
-- channel carries an unlock; with nobody queued, the owner hash goes.
--
-- KEYS[1] owner hash, KEYS[2] waiter list, KEYS[3] deadline set
-- ARGV[1] owner field, ARGV[2] lease ms, ARGV[3] channel prefix (the head's field is appended)
-- Reply: 1 handed over, 0 freed, -1 not the owner.

local owner, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local me, lease, prefix = ARGV[1], ARGV[2], ARGV[3]

if redis.call('HEXISTS', owner, me) == 0 then
  return -1
end
local head = redis.call('LPOP', queue)
if not head then
  redis.call('DEL', owner)
  return 0
end
redis.call('ZREM', deadlines, head)
redis.call('HDEL', owner, me)
redis.call('HSET', owner, head, 1)
redis.call('PEXPIRE', owner, lease)
redis.call('PUBLISH', prefix .. head, '0')
return 1
