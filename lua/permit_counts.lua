-- Permit-expirable semaphore: reclaim expired permits, then count (PROTOCOL 11), as Redisson's
-- availablePermits and acquiredPermits do. Reclaims at most 1000 per call (Redisson's unbounded
-- unpack could exceed Lua's stack).
--
-- KEYS[1] the semaphore NAME, KEYS[2] the permits' expiries `{NAME}:timeout`
-- ARGV[1] publish command, ARGV[2] the semaphore's channel
--
-- Reply: {available, acquired}: the count in NAME (0 when missing) and the permits held now.

local name, expiries = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', expiries, 0, now, 'LIMIT', 0, 1000)
if #expired > 0 then
  redis.call('ZREM', expiries, unpack(expired))
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
