-- Read-write lock: a writer-preferring waiter stops waiting (PROTOCOL 10) and leaves the queue.
--
-- KEYS[1] the lock hash NAME, KEYS[2..5] the writer-preferring queue: arrival queue, writers,
-- liveness marks, counter (rw_prologue.lua)
-- ARGV[1] the waiter's owner field, ARGV[2] publish command, ARGV[3] the turns channel of the
-- queue
--
-- Reply: 1 the waiter was queued and is now removed, 0 it was not queued (any more).
-- When others are still queued, the new turns are announced: readers behind a writer that left,
-- or a writer now at the head, may enter.

local q = {queue = KEYS[2], writers = KEYS[3], live = KEYS[4], seq = KEYS[5]}
local field, publish_cmd, turns = ARGV[1], ARGV[2], ARGV[3]

if not rw_leave(q, field) then
  return 0
end
rw_announce(q, publish_cmd, turns)
return 1
