-- Semaphore: settle an acquire whose reply never came (a lost connection, a timeout, a future
-- dropped while the call was in flight), PROTOCOL 11. Safe to send any number of times.
--
-- KEYS[1] the semaphore NAME, KEYS[2] that acquire's mark
-- ARGV[1] how many permits it asked for, ARGV[2] how long the mark lives (ms), ARGV[3] publish
-- command, ARGV[4] the semaphore's channel
--
-- 'taken': the acquire ran and nobody will use its permits: give them back and publish. No mark:
-- the acquire has not run (or never will): mark it 'void' so that a late arrival takes nothing.
--
-- Reply: 1 permits were given back, 0 there was nothing to give back.

local name, mark = KEYS[1], KEYS[2]
local permits, mark_ms = ARGV[1], ARGV[2]
local publish_cmd, channel = ARGV[3], ARGV[4]

local done = redis.call('GET', mark)
if done == 'taken' then
  local now = exact_count(redis.call('INCRBY', name, permits), name)
  redis.call(publish_cmd, channel, now)
  redis.call('SET', mark, 'released', 'PX', mark_ms)
  return 1
elseif not done then
  redis.call('SET', mark, 'void', 'PX', mark_ms)
end
return 0
