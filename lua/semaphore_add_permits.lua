-- Semaphore: add (or, negative, remove) permits and publish the new count (Redisson's
-- addPermits, PROTOCOL 11). INCRBY keeps a TTL the key may have (Redisson's SET drops it).
--
-- KEYS[1] the semaphore NAME, KEYS[2] this call's mark
-- ARGV[1] the change, ARGV[2] how long the mark lives (ms), ARGV[3] publish command, ARGV[4] the
-- semaphore's channel
--
-- Reply: {1, new count}, or {0, count} when an earlier send of this call did it already; counts
-- exact (lua/count_prologue.lua).

local name, mark = KEYS[1], KEYS[2]
local delta, mark_ms = ARGV[1], ARGV[2]

if redis.call('GET', mark) then
  return {0, count_of(redis.call('GET', name))}
end
local now = exact_count(redis.call('INCRBY', name, delta), name)
redis.call(ARGV[3], ARGV[4], now)
redis.call('SET', mark, 'done', 'PX', mark_ms)
return {1, now}
