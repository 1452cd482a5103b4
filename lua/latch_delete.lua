-- Count-down latch: delete it (PROTOCOL 12); when there was one, publish '0', the message that
-- tells every waiter the latch opened. A missing latch counts zero, so that is what the waiters
-- find when they look again: fairlock's (which look after any message) and Redisson's, which
-- open their local latch and re-read the count only on '0'. Redisson's own delete publishes '1'
-- (count set), which closes a Java waiter's local latch instead: its await() keeps waiting for
-- a latch that no longer exists (for ever without a timeout).
--
-- KEYS[1] the latch NAME
-- ARGV[1] publish command, ARGV[2] the latch's channel
--
-- Reply: 1 deleted, 0 there was no latch.

if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[1], ARGV[2], '0')
  return 1
end
return 0
