-- Test peer, fair lock: one acquire poll of a Java thread (PROTOCOL 4 acquire).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] fencing counter
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] wait ms (300000 for lock()), ARGV[4] now (epoch ms)
--
-- Reply: {1, token, count} granted or re-entered (the fencing counter is bumped on every grant;
--        count > 1 is a re-entry: the test's bookkeeping, Redisson replies nil);
--        {0, ttl, deadline} not granted: `ttl` is how long the thread may sleep before polling
--        again, `deadline` the score this poll queued us with (-1 when we were queued already).
--
-- On a fresh grant every other waiter's deadline moves `wait` earlier, whoever wrote it: Redisson
-- assumes the waiters behind it counted on this wait when they queued.

local name, queue, deadlines, counter = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lease, me, wait, now = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

drop_expired_front(queue, deadlines, now)

-- The token is read back as text: the INCR's reply passes through a Lua number, rounded beyond
-- 2^53 (the torture test starts counters there).
local function granted(count)
  redis.call('PEXPIRE', name, lease)
  redis.call('INCR', counter)
  return {1, redis.call('GET', counter), count}
end

if redis.call('EXISTS', name) == 0 then
  local front = redis.call('LINDEX', queue, 0)
  if not front or front == me then
    if front then
      redis.call('LPOP', queue)
    end
    redis.call('ZREM', deadlines, me)
    for _, waiter in ipairs(redis.call('ZRANGE', deadlines, 0, -1)) do
      redis.call('ZINCRBY', deadlines, -wait, waiter)
    end
    redis.call('HSET', name, me, 1)
    return granted(1)
  end
end

if redis.call('HEXISTS', name, me) == 1 then
  return granted(redis.call('HINCRBY', name, me, 1))
end

-- Queued already: sleep at most as long as the lock lives.
if redis.call('ZSCORE', deadlines, me) then
  return {0, math.max(0, redis.call('PTTL', name)), -1}
end

-- Join the tail: expect to wait for whoever is last (its deadline), or else for the lock's TTL.
local last = redis.call('LINDEX', queue, -1)
local last_deadline = last and last ~= me and redis.call('ZSCORE', deadlines, last)
local ttl
if last_deadline then
  ttl = tonumber(last_deadline) - now
else
  ttl = redis.call('PTTL', name)
end
local deadline = ttl + wait + now
if redis.call('ZADD', deadlines, deadline, me) == 1 then
  redis.call('RPUSH', queue, me)
end
return {0, ttl, deadline}
