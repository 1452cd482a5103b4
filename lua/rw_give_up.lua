-- Read-write lock: a writer-preferring waiter stops waiting (PROTOCOL 10) and leaves the queue.
--
-- KEYS[1] the lock hash NAME, KEYS[2..5] the writer-preferring queue: arrival queue, writers,
-- liveness marks, counter (rw_prologue.lua)
-- ARGV[1] the waiter's owner field, ARGV[2] publish command, ARGV[3] the lock's channel
--
-- Reply: 1 the waiter was queued and is now removed, 0 it was not queued (any more).
-- When others are still queued and no writer holds the lock, '0' is published: readers behind
-- a writer that left, or a writer now at the head, may enter.

local name = KEYS[1]
local q = {queue = KEYS[2], writers = KEYS[3], live = KEYS[4], seq = KEYS[5]}
local field, publish_cmd, channel = ARGV[1], ARGV[2], ARGV[3]

if not rw_leave(q, field) then
  return 0
end
if redis.call('EXISTS', q.queue) == 1 and redis.call('HGET', name, 'mode') ~= 'write' then
  redis.call(publish_cmd, channel, '0')
end
return 1
