-- Test peer, fair lock: a Java tryLock whose wait ran out leaves the queue (PROTOCOL 4 give up).
--
-- KEYS[1] waiter queue, KEYS[2] deadline zset
-- ARGV[1] owner field, ARGV[2] the wait ms it queued with
--
-- Reply: the number of waiters behind it whose deadlines moved `wait` earlier. Nobody is told.

local queue, deadlines = KEYS[1], KEYS[2]
local me, wait = ARGV[1], tonumber(ARGV[2])

local moved, behind = 0, false
for _, waiter in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  if behind then
    redis.call('ZINCRBY', deadlines, -wait, waiter)
    moved = moved + 1
  elseif waiter == me then
    behind = true
  end
end
redis.call('ZREM', deadlines, me)
redis.call('LREM', queue, 0, me)
return moved
