-- Baseline for benches/contended.rs: the acquire of the cheapest fair lock that keeps the layout
-- Redisson's fair lock shares (PROTOCOL 4): the owner hash, the waiter list and the deadline set.
-- It grants only a free lock with nobody ahead; otherwise it queues the caller once (a deadline
-- score and a place at the tail) and the caller sleeps until the holder's release hands it the
-- lock and tells it on its own channel. No purge of expired waiters, no liveness, no fencing, no
-- recovery of a lost message: a yardstick of what the layout costs, not a usable lock.
--
-- KEYS[1] owner hash, KEYS[2] waiter list, KEYS[3] deadline set
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] deadline score (epoch ms)
-- Reply: 1 granted, 0 queued (wait for the hand-off message).

local owner, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local lease, me, deadline = ARGV[1], ARGV[2], ARGV[3]

if redis.call('EXISTS', owner) == 0 then
  local head = redis.call('LINDEX', queue, 0)
  if not head or head == me then
    if head then
      redis.call('LPOP', queue)
      redis.call('ZREM', deadlines, me)
    end
    redis.call('HSET', owner, me, 1)
    redis.call('PEXPIRE', owner, lease)
    return 1
  end
end

if redis.call('ZADD', deadlines, 'NX', deadline, me) == 1 then
  redis.call('RPUSH', queue, me)
end
return 0
