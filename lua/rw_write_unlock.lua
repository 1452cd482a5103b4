-- Read-write lock, write side: release holds (RReadWriteLock layout, PROTOCOL 10), a
-- compare-and-set on our hold count (`compare_release`, lua/release_prologue.lua), so sending
-- the same release twice never releases twice.
--
-- KEYS[1] the lock hash NAME
-- ARGV[1] our write field, ARGV[2] the hold count the caller believes Redis has for it,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (it is released too when it is there), ARGV[5] the TTL (ms) the remaining
-- holds need (-1: as it is), ARGV[6] publish command, ARGV[7] the lock's channel
--
-- The last write hold leaves: the lock is deleted when nothing else is in it, or, when the
-- writer's holder still has read holds (a downgrade), it turns to read mode. Either way '1' is
-- published, which wakes every waiter (Redisson publishes nothing on a downgrade, so readers
-- waiting elsewhere would sleep until the TTL).
--
-- Holds that remain keep the TTL they need; when that cuts the lock's by more than half (a
-- watchdog hold released while a short fixed one stays), '1' is published too, so waiters told
-- the old TTL look again (an expiry announces nothing).
--
-- Reply: {1, 0} our write holds are gone, {0, count} holds remain, {2, 0} the lock no longer
--        existed, {-1, 0} we do not hold it for writing, {3, count} our count is not what the
--        caller believes: nothing was changed.

local name = KEYS[1]

local held, by, reply = compare_release(name)
if reply then
  return reply
end
if held > by then
  redis.call('HINCRBY', name, field, -by)
  -- Our own read holds (a downgrade) may need more than the write holds left: the TTL becomes
  -- what the write holds need only when nothing else is in the hash; otherwise it is only raised.
  if redis.call('HLEN', name) == 2 then
    if set_remaining_ttl(name, remaining_ttl) then
      redis.call(publish_cmd, channel, '1')
    end
  else
    raise_ttl(name, remaining_ttl)
  end
  return {0, held - by}
end
redis.call('HDEL', name, field)
if redis.call('HLEN', name) <= 1 then
  redis.call('DEL', name)
else
  redis.call('HSET', name, 'mode', 'read')
end
redis.call(publish_cmd, channel, '1')
return {1, 0}
