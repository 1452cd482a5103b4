-- Baseline for benches/semaphore.rs: a polling semaphore's acquire, as a crate without waiters
-- would write it. Takes ARGV[1] permits from the count KEYS[1] when that many are there.
-- Reply: 1 taken, 0 not enough (the caller sleeps and tries again).

local available = tonumber(redis.call('GET', KEYS[1]) or '0')
if available >= tonumber(ARGV[1]) then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  return 1
end
return 0
