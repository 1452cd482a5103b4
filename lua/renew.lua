-- Watchdog renewal for a batch of held locks, both kinds (PROTOCOL 3 renew).
--
-- KEYS[i] owner hash NAME of lock i (all in one cluster slot)
-- ARGV[1] new TTL in ms (the watchdog timeout), ARGV[i + 1] our owner field for lock i
--
-- Reply: one integer per lock: 1 renewed, 0 our field is gone (the lock was lost). A lock is renewed
-- only while our field is there, so a renewal that crosses our own unlock, or somebody else's
-- acquisition, never extends a lock that is not ours.

local ttl = tonumber(ARGV[1])
local replies = {}
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ttl)
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
