-- Fair lock: a waiter stops waiting (its wait ran out, its future was dropped, or its client shut
-- down).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset,
-- KEYS[5] grant requests hash, KEYS[6] fencing counter
-- ARGV[1] owner field of the waiter, ARGV[2] publish command, ARGV[3] release channel of this lock,
-- ARGV[4] the hold count the caller's client believes Redis has for the field
--
-- Reply: 1 when the waiter was queued and is now removed, 2 when it was no longer queued because
-- the lock had been handed to it (PROTOCOL 8) and that hold is now given back, 0 otherwise.
--
-- A waiter that is no longer queued and whose field holds one more hold than its client counts
-- was granted the lock while it was giving up (the grant and this give-up crossed): the hold is
-- given back here, atomically, and the lock handed on. (With the field's operations in one line
-- on the client, nothing else of the field can have taken that hold unseen: see
-- `engine/field.rs`.)
--
-- Unlike RFairLock, which publishes nothing here, the new head is woken (or granted the lock) when
-- the lock is free, so the queue never stalls behind a waiter that left. The deadlines of later
-- waiters are not shifted (PROTOCOL 7): an unshifted deadline only makes a Redisson waiter more
-- patient.

local k = {name = KEYS[1], queue = KEYS[2], deadlines = KEYS[3], liveness = KEYS[4],
  grants = KEYS[5], token = KEYS[6]}
local field, publish_cmd, channel_prefix = ARGV[1], ARGV[2], ARGV[3]
local expected = tonumber(ARGV[4])

local was_queued = leave_queue(k.queue, k.deadlines, k.liveness, k.grants, field)
if was_queued == 0 then
  local held = tonumber(redis.call('HGET', k.name, field)) or 0
  if held == expected + 1 then
    if held > 1 then
      redis.call('HINCRBY', k.name, field, -1)
      return 2
    end
    redis.call('DEL', k.name)
    pass_on(k, publish_cmd, channel_prefix)
    return 2
  end
end
if redis.call('EXISTS', k.name) == 0 then
  pass_on(k, publish_cmd, channel_prefix)
end
return was_queued
