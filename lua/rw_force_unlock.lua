-- Read-write lock: delete the lock whoever holds it (RReadWriteLock layout, PROTOCOL 10).
--
-- KEYS[1] the lock hash NAME
-- ARGV[1] 'read' to delete it only while it is in read mode (Redisson's read-lock forceUnlock),
-- 'write' only in write mode (the write lock's), '' in any mode; ARGV[2] publish command,
-- ARGV[3] the lock's channel
--
-- Reply: 1 when the lock was deleted ('0' published after a read mode, '1' after a write mode),
-- 0 when there was none (in that mode). Lease keys of readers are left to expire, as Redisson
-- leaves them: nothing reads a lease key without its field in the hash.

local mode = redis.call('HGET', KEYS[1], 'mode')
if mode == false or (ARGV[1] ~= '' and mode ~= ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[2], ARGV[3], mode == 'read' and '0' or '1')
return 1
