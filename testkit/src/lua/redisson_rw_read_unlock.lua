-- Test peer, read-write lock: a Java thread releases one read hold, as Redisson's RReadWriteLock
-- does (PROTOCOL 10), without its unlock latch.
--
-- KEYS[1] the lock hash NAME, KEYS[2] the thread's lease-key prefix
-- `{NAME}:<field>:rwlock_timeout`, KEYS[3] the base of every reader's lease keys (`{NAME}`)
-- ARGV[1] the thread's read field, ARGV[2] the lock's channel
--
-- Reply: 1 the lock is free ('0' published), 0 others (or more holds) remain, -1 not held.
-- Readers whose lease keys all expired no longer count: the hash lives as long as the longest
-- live lease key, and goes when there is none.

local name, prefix, base = KEYS[1], KEYS[2], KEYS[3]
local me, channel = ARGV[1], ARGV[2]

local mode = redis.call('HGET', name, 'mode')
if mode == false then
  redis.call('PUBLISH', channel, '0')
  return -1
end
if redis.call('HEXISTS', name, me) == 0 then
  return -1
end
local n = redis.call('HINCRBY', name, me, -1)
if n == 0 then
  redis.call('HDEL', name, me)
end
redis.call('DEL', prefix .. ':' .. (n + 1))
if redis.call('HLEN', name) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('HKEYS', name)) do
    local count = tonumber(redis.call('HGET', name, field))
    if count then
      for i = count, 1, -1 do
        longest = math.max(longest, redis.call('PTTL', base .. ':' .. field .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('PEXPIRE', name, longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('DEL', name)
redis.call('PUBLISH', channel, '0')
return 1
