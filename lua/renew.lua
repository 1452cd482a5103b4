-- Watchdog renewal for a batch of held locks, both kinds (PROTOCOL 3 renew).
--
-- KEYS[i] owner hash NAME of lock i (all in one cluster slot)
-- ARGV[1] new TTL in ms (the watchdog timeout), ARGV[i + 1] our owner field for lock i
--
-- Reply: one integer per lock: 1 renewed, 0 our field is gone (the lock was lost). A lock is renewed
-- only while our field is there, so a renewal that crosses our own unlock, or somebody else's
-- acquisition, never extends a lock that is not ours; and the TTL is never shortened (a hold of
-- ours with a longer fixed lease may need more). A key of the wrong type under a lock's name
-- reports 0 for that lock alone: our field cannot be in it, and the other locks are renewed.

local ttl = tonumber(ARGV[1])
local replies = {}
for i = 1, #KEYS do
  local present = redis.pcall('HEXISTS', KEYS[i], ARGV[i + 1])
  if present == 1 then
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
