-- Permit-expirable semaphore: reclaim expired permits, then count (PROTOCOL 11), as Redisson's
-- availablePermits and acquiredPermits do. Reclaims at most 1000 per call (bounded work; Redisson
-- reclaims them all with one unpack, which fails near 8,000).
--
-- KEYS[1] the semaphore NAME, KEYS[2] the permits' expiries `{NAME}:timeout`
-- ARGV[1] publish command, ARGV[2] the semaphore's channel
--
-- Reply: {available, acquired}: the count in NAME (0 when missing) and the permits held now.

local name, expiries = KEYS[1], KEYS[2]
local expired = redis.call('ZRANGEBYSCORE', expiries, 0, server_now_ms(), 'LIMIT', 0, 1000)
if #expired > 0 then
  zrem_all(expiries, expired, 1)
  local value = redis.call('INCRBY', name, #expired)
  if value > 0 then
    redis.call(ARGV[1], ARGV[2], value)
  end
end
local available = tonumber(redis.call('GET', name) or '0')
if available == nil then
  return redis.error_reply('ERR fairlock: semaphore ' .. name .. ' does not hold a number')
end
return {available, redis.call('ZCARD', expiries)}
