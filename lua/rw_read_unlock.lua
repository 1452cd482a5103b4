-- Read-write lock, read side: release holds (RReadWriteLock layout, PROTOCOL 10), a
-- compare-and-set on our hold count (`compare_release`, lua/release_prologue.lua), so sending
-- the same release twice never releases twice.
--
-- KEYS[1] the lock hash NAME, KEYS[2] the base the lease keys are named from (`{NAME}`, or NAME
-- when it has a hash tag)
-- ARGV[1] our read field, ARGV[2] the hold count the caller believes Redis has for it,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (it is released too when it is there), ARGV[5] the TTL (ms) the remaining
-- holds need (-1: as they are), ARGV[6] publish command, ARGV[7] the lock's channel
--
-- Releasing hold k deletes lease key k, as Redisson does (the top-numbered one: every key of ours
-- lives as long as our longest need, see rw_read_acquire.lua). When our field is gone, the lock
-- lives on for whoever still holds it: the hash's TTL becomes the longest of every reader's live
-- lease keys (Redisson's rule: a reader whose lease keys expired is dead), or, when nobody is
-- alive in read mode, the hash is deleted and '0' is published (the last reader left). '0' is
-- also published when the TTL is cut by more than half (see below).
--
-- Reply: {1, 0} our field is gone (the lock is free, or others still hold it), {0, count} holds
--        of ours remain, {2, 0} the lock no longer existed, {-1, 0} we hold no read lock on it,
--        {3, count} our count is not what the caller believes: nothing was changed.

local name, base = KEYS[1], KEYS[2]
local prefix = base .. ':' .. field .. ':rwlock_timeout:'

local held, by, reply = compare_release(name)
if reply then
  return reply
end
for k = held, math.max(held - by, 0) + 1, -1 do
  redis.call('DEL', prefix .. k)
end
if held > by then
  redis.call('HINCRBY', name, field, -by)
  raise_ttl(name, remaining_ttl)
  return {0, held - by}
end
redis.call('HDEL', name, field)

-- One read of the whole hash answers what Redisson's walk reads field by field: the mode, whether
-- anyone else still holds the lock (a field besides `mode`), and every holder's count.
local all = redis.call('HGETALL', name)
local mode
for i = 1, #all, 2 do
  if all[i] == 'mode' then
    mode = all[i + 1]
  end
end
if #all > 2 then
  if mode == 'write' then
    -- We were the writer's own read holds (a downgrade in progress): the writer keeps the lock
    -- and its TTL.
    return {1, 0}
  end
  local longest = -3
  for i = 1, #all, 2 do
    local count = tonumber(all[i + 1])
    if count then
      local keys = base .. ':' .. all[i] .. ':rwlock_timeout:'
      for k = count, 1, -1 do
        longest = math.max(longest, redis.call('PTTL', keys .. k))
      end
    end
  end
  if longest > 0 then
    -- Waiters sleep at most the TTL they were told; when the lock now ends much sooner (the
    -- readers left are dead ones, or ones with short leases), they are told to look again:
    -- '0' makes a Redisson waiter retry too, which is harmless. Live watchdog readers keep
    -- their keys above two thirds of the timeout, so their leaving never wakes anybody.
    local before = redis.call('PTTL', name)
    redis.call('PEXPIRE', name, longest)
    if longest < before / 2 then
      redis.call(publish_cmd, channel, '0')
    end
    return {1, 0}
  end
end
redis.call('DEL', name)
redis.call(publish_cmd, channel, '0')
return {1, 0}
