-- Baseline for benches/queue_depth.rs: a model, in our own words, of how a Redisson fair-lock
-- acquire behaves on the wire (PROTOCOL 4): the client's clock, a purge of expired heads, and on
-- every grant a shift of EVERY queued deadline by the caller's wait (work proportional to the
-- queue). It exists to be measured against fairlock's O(1) acquire; it is not shipped.
--
-- KEYS[1] owner hash, KEYS[2] waiter queue (list), KEYS[3] deadline zset
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] wait ms, ARGV[4] the caller's clock (epoch ms)
-- Reply: nil when granted (or re-entered), else how long (ms) the caller may sleep.

local owner, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local lease, me, wait, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

-- Expired heads leave, oldest first; a head without a deadline stops the purge.
local head = redis.call('LINDEX', queue, 0)
while head do
  local deadline = redis.call('ZSCORE', deadlines, head)
  if not deadline or tonumber(deadline) > now then
    break
  end
  redis.call('ZREM', deadlines, head)
  redis.call('LPOP', queue)
  head = redis.call('LINDEX', queue, 0)
end

if redis.call('EXISTS', owner) == 0 and (not head or head == me) then
  if head then
    redis.call('LPOP', queue)
  end
  redis.call('ZREM', deadlines, me)
  -- Everyone left behind moves up one place: their deadlines come `wait` closer.
  for _, waiter in ipairs(redis.call('ZRANGE', deadlines, 0, -1)) do
    redis.call('ZINCRBY', deadlines, -wait, waiter)
  end
  redis.call('HSET', owner, me, 1)
  redis.call('PEXPIRE', owner, lease)
  return nil
end

if redis.call('HEXISTS', owner, me) == 1 then
  redis.call('HINCRBY', owner, me, 1)
  redis.call('PEXPIRE', owner, lease)
  return nil
end

if redis.call('ZSCORE', deadlines, me) then
  return math.max(0, redis.call('PTTL', owner))
end

-- Join the tail: our deadline is the last waiter's (or the lock's expiry) plus our wait.
local tail = redis.call('LINDEX', queue, -1)
local tail_deadline = tail and redis.call('ZSCORE', deadlines, tail)
local ttl
if tail_deadline then
  ttl = tonumber(tail_deadline) - now
else
  ttl = redis.call('PTTL', owner)
end
if redis.call('ZADD', deadlines, ttl + wait + now, me) == 1 then
  redis.call('RPUSH', queue, me)
end
return ttl
