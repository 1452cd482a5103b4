-- Count-down latch: delete it (Redisson's delete, PROTOCOL 12); when there was one, publish '1'
-- as Redisson does (its waiters close their local latch and look again: a missing latch counts 0).
--
-- KEYS[1] the latch NAME
-- ARGV[1] publish command, ARGV[2] the latch's channel
--
-- Reply: 1 deleted, 0 there was no latch.

if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[1], ARGV[2], '1')
  return 1
end
return 0
