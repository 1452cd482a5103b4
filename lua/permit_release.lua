-- Permit-expirable semaphore: give permits back by id (PROTOCOL 11) and publish the new count.
-- Safe to resend: an id no longer there (released already, or expired and reclaimed) returns
-- nothing.
--
-- KEYS[1] the semaphore NAME, KEYS[2] the permits' expiries `{NAME}:timeout`
-- ARGV[1] publish command, ARGV[2] the semaphore's channel, ARGV[3..] permit ids (raw 16 bytes)
--
-- Any number of ids: they are removed in chunks (`zrem_all`, lua/permit_prologue.lua).
--
-- Reply: how many of the ids were there (and are now available again).

local name, expiries = KEYS[1], KEYS[2]
local removed = zrem_all(expiries, ARGV, 3)
if removed > 0 then
  local value = exact_count(redis.call('INCRBY', name, removed), name)
  redis.call(ARGV[1], ARGV[2], value)
end
return removed
