-- `fairlock::admin::force_unlock` (`fairlock force-unlock NAME`): delete the lock whoever holds it, drop the dead waiters at the
-- head of its queue, and tell the live head (and any plain-lock waiter) that it is free.
--
-- KEYS[1] owner hash NAME, KEYS[2] queue Q, KEYS[3] deadline zset Z, KEYS[4] liveness zset L,
-- KEYS[5] grant requests hash G
-- (a read-write lock's hash too: its `mode` field is not an owner, and it is announced with '1'
-- on `redisson_rwlock:{NAME}` as well)
-- ARGV[1] the lock's release channel; ARGV[2..] publish commands (PUBLISH and/or SPUBLISH)
--
-- Reply: {1 when NAME was deleted else 0,
--         {field, hold count, ...} of the deleted owner hash,
--         {field, reason, ...} of the dead heads dropped,
--         the live head that was told (or ''),
--         receivers on the release channel, receivers on the head's channel}
--
-- A lock that is not held is left alone (nothing deleted, nobody told): `purge-dead` is the
-- command for a queue behind a free lock. Only the head is examined, as every fair script does,
-- so the queue behind a live head is untouched.

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local grants = KEYS[5]
local channel = ARGV[1]

-- A read-write lock (RReadWriteLock: a `mode` field) announces on its own channel, whose
-- name follows the same rule as the release channel's.
local mode = redis.pcall('HGET', name, 'mode')
local owners = {}
local all = redis.call('HGETALL', name)
for i = 1, #all, 2 do
  if all[i] ~= 'mode' then
    owners[#owners + 1] = all[i]
    owners[#owners + 1] = all[i + 1]
  end
end
if redis.call('DEL', name) == 0 then
  return {0, {}, {}, '', 0, 0}
end

local commands = publish_commands()
local now = server_ms()
local known = fairlock_clients(liveness)
local dropped = {}
local head = redis.call('LINDEX', queue, 0)
while head do
  local reason = dead_reason(deadlines, liveness, known, head, now)
  if not reason then
    break
  end
  drop_waiter(queue, deadlines, liveness, grants, head)
  dropped[#dropped + 1] = head
  dropped[#dropped + 1] = reason
  head = redis.call('LINDEX', queue, 0)
end

-- Plain-lock waiters listen on the release channel itself; fair waiters on their own channel.
local on_release = announce(channel, commands)
if type(mode) == 'string' then
  -- '1' wakes every waiting Redisson reader and writer (a '0' would wake one per JVM).
  local rw_channel = 'redisson_rwlock' .. string.sub(channel, #'redisson_lock__channel' + 1)
  for _, command in ipairs(commands) do
    on_release = on_release + redis.call(command, rw_channel, '1')
  end
end
local on_head = 0
if head then
  on_head = announce(channel .. ':' .. head, commands)
end
return {1, owners, dropped, head or '', on_release, on_head}
