-- Test peer: one watchdog renewal (PROTOCOL 3 renew), either lock kind.
--
-- KEYS[1] owner hash NAME; ARGV[1] watchdog timeout ms, ARGV[2] owner field
-- Reply: 1 renewed, 0 our field is gone (the lock was lost).

if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 1
end
return 0
