-- Count-down latch: count down by one (Redisson's countDown, PROTOCOL 12). At zero the key is
-- deleted and '0' published (the latch is open). As in Redisson, counting down a latch that does
-- not exist changes nothing and publishes nothing.
--
-- KEYS[1] the latch NAME, KEYS[2] this call's mark (`{NAME}:fairlock_call:<call id>`)
-- ARGV[1] how long the mark lives (ms), ARGV[2] publish command, ARGV[3] the latch's channel
--
-- The mark makes a resend after a lost reply count nothing a second time.
--
-- Reply: the count after this call (0: open; exact, lua/count_prologue.lua), or -1 when an
-- earlier send of it counted already.

local name, mark = KEYS[1], KEYS[2]
if redis.call('GET', mark) then
  return -1
end
local left = redis.call('DECR', name)
if left <= 0 then
  redis.call('DEL', name)
end
if left == 0 then
  redis.call(ARGV[2], ARGV[3], '0')
end
redis.call('SET', mark, 'done', 'PX', ARGV[1])
if left < 0 then
  return 0
end
return exact_count(left, name)
