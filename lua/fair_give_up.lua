-- Fair lock: a waiter stops waiting (its wait ran out, its future was dropped, or its client shut
-- down).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset
-- ARGV[1] owner field of the waiter, ARGV[2] publish command, ARGV[3] release channel of this lock
--
-- Reply: 1 when the waiter was queued and is now removed, 0 when it was not queued.
--
-- Unlike RFairLock, which publishes nothing here, the new head is woken when the lock is free, so the
-- queue never stalls behind a waiter that left. The deadlines of later waiters are not shifted
-- (PROTOCOL 7): an unshifted deadline only makes a Redisson waiter more patient.

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local field, publish_cmd, channel_prefix = ARGV[1], ARGV[2], ARGV[3]

local was_queued = leave_queue(queue, deadlines, liveness, field)
if redis.call('EXISTS', name) == 0 then
  wake_head(queue, deadlines, liveness, publish_cmd, channel_prefix)
end
return was_queued
