-- Count-down latch: set the count when the latch does not exist (Redisson's trySetCount,
-- PROTOCOL 12) and publish '1' (the latch is closed).
--
-- KEYS[1] the latch NAME
-- ARGV[1] the count (>= 1), ARGV[2] publish command, ARGV[3] the latch's channel
--
-- Reply: 1 set, 0 the latch existed (nothing changed).

local name = KEYS[1]
if redis.call('EXISTS', name) == 1 then
  return 0
end
redis.call('SET', name, ARGV[1])
redis.call(ARGV[2], ARGV[3], '1')
return 1
