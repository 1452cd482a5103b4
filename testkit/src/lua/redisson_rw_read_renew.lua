-- Test peer, read-write lock: one watchdog renewal of a Java thread's read holds, as Redisson's
-- read-lock renewal does it (PROTOCOL 10): every lease key of the thread, and the hash.
--
-- KEYS[1] the lock hash NAME, KEYS[2] the thread's lease-key prefix
-- `{NAME}:<field>:rwlock_timeout`; ARGV[1] watchdog timeout ms, ARGV[2] the thread's read field
-- Reply: 1 renewed, 0 the thread's field is gone.

local count = redis.call('HGET', KEYS[1], ARGV[2])
if count == false then
  return 0
end
for c = tonumber(count), 1, -1 do
  redis.call('PEXPIRE', KEYS[2] .. ':' .. c, ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
