-- Test peer, read-write lock: a Java thread releases one write hold, as Redisson's
-- RReadWriteLock does (PROTOCOL 10), without its unlock latch.
--
-- KEYS[1] the lock hash NAME; ARGV[1] lease ms (re-applied while holds remain), ARGV[2] the
-- thread's write field, ARGV[3] the lock's channel
--
-- Reply: 1 the write holds are gone ('1' published when the lock went; a downgrade to read mode
-- publishes nothing, as in Redisson), 0 holds remain, -1 not held.

local name = KEYS[1]
local lease, me, channel = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local mode = redis.call('HGET', name, 'mode')
if mode == false then
  redis.call('PUBLISH', channel, '1')
  return -1
end
if mode ~= 'write' or redis.call('HEXISTS', name, me) == 0 then
  return -1
end
if redis.call('HINCRBY', name, me, -1) > 0 then
  redis.call('PEXPIRE', name, lease)
  return 0
end
redis.call('HDEL', name, me)
if redis.call('HLEN', name) == 1 then
  redis.call('DEL', name)
  redis.call('PUBLISH', channel, '1')
else
  redis.call('HSET', name, 'mode', 'read')
end
return 1
