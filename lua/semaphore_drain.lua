-- Semaphore: take every available permit (Redisson's drainPermits, PROTOCOL 11). Nothing is
-- published (nobody can enter after it).
--
-- KEYS[1] the semaphore NAME
--
-- Reply: how many permits were available (0 when the semaphore does not exist or had none),
-- exact (lua/count_prologue.lua).

local name = KEYS[1]
local value = redis.call('GET', name)
if not value then
  return 0
end
redis.call('SET', name, 0, 'KEEPTTL')
return count_of(value)
