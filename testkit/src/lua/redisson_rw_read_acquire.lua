-- Test peer, read-write lock: one read acquire poll of a Java thread, as Redisson's
-- RReadWriteLock read side does it (PROTOCOL 10).
--
-- KEYS[1] the lock hash NAME, KEYS[2] the thread's lease-key prefix
-- `{NAME}:<field>:rwlock_timeout`
-- ARGV[1] lease ms, ARGV[2] the thread's read field, ARGV[3] its write field
--
-- Reply: {1, 0, count} granted (count: the thread's read holds now; no fencing token),
--        {0, pttl} a writer holds it.

local name, prefix = KEYS[1], KEYS[2]
local lease, me, writer = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local mode = redis.call('HGET', name, 'mode')
if mode == false then
  redis.call('HSET', name, 'mode', 'read')
  redis.call('HSET', name, me, 1)
  redis.call('SET', prefix .. ':1', 1, 'PX', lease)
  redis.call('PEXPIRE', name, lease)
  return {1, 0, 1}
end
if mode == 'read' or (mode == 'write' and redis.call('HEXISTS', name, writer) == 1) then
  local n = redis.call('HINCRBY', name, me, 1)
  redis.call('SET', prefix .. ':' .. n, 1, 'PX', lease)
  redis.call('PEXPIRE', name, math.max(redis.call('PTTL', name), lease))
  return {1, 0, n}
end
return {0, redis.call('PTTL', name)}
