-- Semaphore: set the number of permits when the semaphore does not exist yet (Redisson's
-- trySetPermits, PROTOCOL 11), and publish it.
--
-- KEYS[1] the semaphore NAME
-- ARGV[1] the permits (>= 0), ARGV[2] publish command, ARGV[3] the semaphore's channel
--
-- Reply: 1 set, 0 the semaphore existed (nothing changed).

local name, permits = KEYS[1], ARGV[1]
if redis.call('EXISTS', name) == 1 then
  return 0
end
redis.call('SET', name, permits)
redis.call(ARGV[2], ARGV[3], permits)
return 1
