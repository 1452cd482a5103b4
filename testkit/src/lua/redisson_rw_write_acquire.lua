-- Test peer, read-write lock: one write acquire poll of a Java thread, as Redisson's
-- RReadWriteLock write side does it (PROTOCOL 10).
--
-- KEYS[1] the lock hash NAME; ARGV[1] lease ms, ARGV[2] the thread's write field
--
-- Reply: {1, 0, count} granted or re-entered (no fencing token), {0, pttl} held by others.

local name = KEYS[1]
local lease, me = tonumber(ARGV[1]), ARGV[2]

local mode = redis.call('HGET', name, 'mode')
if mode == false then
  redis.call('HSET', name, 'mode', 'write')
  redis.call('HSET', name, me, 1)
  redis.call('PEXPIRE', name, lease)
  return {1, 0, 1}
end
if mode == 'write' and redis.call('HEXISTS', name, me) == 1 then
  local n = redis.call('HINCRBY', name, me, 1)
  -- Redisson adds the lease to what is left.
  redis.call('PEXPIRE', name, redis.call('PTTL', name) + lease)
  return {1, 0, n}
end
return {0, redis.call('PTTL', name)}
