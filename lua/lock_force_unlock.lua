-- Non-fair lock: delete the lock whoever holds it (PROTOCOL 3 force unlock).
--
-- KEYS[1] owner hash NAME; ARGV[1] publish command, ARGV[2] release channel
-- Reply: 1 when a lock was deleted (and '0' published), 0 when there was none.

if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[1], ARGV[2], '0')
  return 1
end
return 0
