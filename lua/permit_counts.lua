-- Permit-expirable semaphore: reclaim expired permits, then count (PROTOCOL 11), as Redisson's
-- availablePermits and acquiredPermits do. Reclaims at most 1000 per call (bounded work; Redisson
-- reclaims them all with one unpack, which fails near 8,000).
--
-- KEYS[1] the semaphore NAME, KEYS[2] the permits' expiries `{NAME}:timeout`
-- ARGV[1] publish command, ARGV[2] the semaphore's channel
--
-- Reply: {available, acquired}: the count in NAME (0 when missing; exact, lua/count_prologue.lua)
-- and the permits held now.

local name, expiries = KEYS[1], KEYS[2]
reclaim_expired(name, expiries, server_now_ms(), 1000, ARGV[1], ARGV[2])
local available, bad = available_count(name)
if bad then
  return bad
end
return {exact_count(available, name), redis.call('ZCARD', expiries)}
