-- Baseline for benches/contended.rs: the layout floor's acquire (layout_acquire.lua) made to run
-- the commands FairLock's acquire runs on the same paths (PROTOCOL 7 and 8), on the same kinds of
-- keys, without what they decide: the contended join's 13 commands (own count, queued check, the
-- tail and its marks, the server clock, the liveness mark, the grant request) where the floor's
-- join runs 3. It isolates the server's cost of those commands from FairLock's client: its
-- contenders wait exactly as the floor's do. Not a usable lock.
--
-- KEYS[1] owner hash, KEYS[2] waiter list, KEYS[3] deadline set, KEYS[4] liveness set,
-- KEYS[5] grant requests hash
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] deadline score (epoch ms),
-- ARGV[4] liveness window ms
-- Reply: 1 granted, 0 queued (wait for the hand-off message).

local owner, queue, deadlines, liveness, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local lease, me, deadline, window = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

-- The uncontended path: FairLock's is the floor's (one EXISTS for both keys).
local found = redis.call('EXISTS', owner, queue)
if found == 0 then
  redis.call('HSET', owner, me, 1)
  redis.call('PEXPIRE', owner, lease)
  return 1
end

-- FairLock reads its own hold count and whether it is queued already.
local exists = found == 2 or redis.call('EXISTS', owner) == 1
redis.call('HGET', owner, me)
local queued = redis.call('ZSCORE', deadlines, me)
if not exists and not queued then
  -- Free with somebody queued (rare here: a release hands the lock to the head): the floor's rule.
  local head = redis.call('LINDEX', queue, 0)
  if not head or head == me then
    if head then
      redis.call('LPOP', queue)
      redis.call('ZREM', deadlines, me)
    end
    redis.call('HSET', owner, me, 1)
    redis.call('PEXPIRE', owner, lease)
    return 1
  end
end
if queued then
  return 0
end

-- The tail and its marks (FairLock's check that no Redisson waiter is ahead, and its deadline).
local tail = redis.call('LINDEX', queue, -1)
if tail then
  redis.call('ZSCORE', deadlines, tail)
  redis.call('ZSCORE', liveness, tail)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('RPUSH', queue, me)
-- The liveness mark, and the set's TTL.
redis.call('ZADD', liveness, now + window, me)
if redis.call('PTTL', liveness) < 0 then
  redis.call('PEXPIRE', liveness, 600000)
end
-- The grant request (direct hand-off).
redis.call('EXISTS', grants)
redis.call('HSET', grants, me, lease .. ':0:1')
redis.call('ZADD', deadlines, deadline, me)
return 0
