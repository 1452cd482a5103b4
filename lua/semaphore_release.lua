-- Semaphore: give permits back and publish the new count (RSemaphore layout, PROTOCOL 11; every
-- release publishes, as Java's waiters only look again when told).
--
-- KEYS[1] the semaphore NAME, KEYS[2] the mark of the call that holds the permits (a guard's
-- acquire) or of this release
-- ARGV[1] how many permits (>= 1), ARGV[2] how long the mark lives (ms), ARGV[3] publish command,
-- ARGV[4] the semaphore's channel
--
-- A mark that says 'released' or 'void' means an earlier send of this release (or a give-up) did
-- the work: a resend changes nothing. Any other state (the acquire's 'taken', or no mark after it
-- expired) releases.
--
-- Reply: {1, count} released: the new number of available permits; {0, count} nothing was done
-- (an earlier send did it): the number available now. Counts are exact (`exact_count`,
-- lua/count_prologue.lua), negative ones included (`addPermits` may take the count below zero).

local name, mark = KEYS[1], KEYS[2]
local permits, mark_ms = ARGV[1], ARGV[2]
local publish_cmd, channel = ARGV[3], ARGV[4]

local done = redis.call('GET', mark)
if done == 'released' or done == 'void' then
  return {0, count_of(redis.call('GET', name))}
end
local now = exact_count(redis.call('INCRBY', name, permits), name)
redis.call(publish_cmd, channel, now)
redis.call('SET', mark, 'released', 'PX', mark_ms)
return {1, now}
