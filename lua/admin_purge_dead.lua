-- `fairlock::admin::purge_dead` (`fairlock purge-dead NAME`): remove every queued waiter of a fair lock that looks dead (judged
-- as the prologue says), wherever it stands in the queue, and when the lock is free tell the new
-- head that it may take it.
--
-- KEYS[1] owner hash NAME, KEYS[2] queue Q, KEYS[3] deadline zset Z, KEYS[4] liveness zset L,
-- KEYS[5] grant requests hash G
-- ARGV[1] the lock's release channel; ARGV[2..] publish commands (PUBLISH and/or SPUBLISH)
--
-- Reply: {{field, reason, ...} removed, the head that was told (or ''), its receivers,
--         queue length after, 1 when NAME exists else 0, 1 when Q or Z existed else 0}
--
-- Unlike a Redisson give-up, removing a waiter does not shift the deadlines of those behind
-- it: they only become more patient (the same argument as PROTOCOL 7's "no shift"). Each removal
-- costs one LREM, so the script is linear in the queue for each dead waiter: an operator's
-- command, not a hot path.

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local grants = KEYS[5]
local channel = ARGV[1]

local had_queue = (redis.call('EXISTS', queue) + redis.call('EXISTS', deadlines)) > 0
local now = server_ms()
local known = fairlock_clients(liveness)
local removed = {}
local seen = {}
for _, field in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  if not seen[field] then
    seen[field] = true
    local reason = dead_reason(deadlines, liveness, known, field, now)
    if reason then
      drop_waiter(queue, deadlines, liveness, grants, field)
      removed[#removed + 1] = field
      removed[#removed + 1] = reason
    end
  end
end

local held = redis.call('EXISTS', name) == 1
local told, receivers = '', 0
if #removed > 0 and not held then
  local head = redis.call('LINDEX', queue, 0)
  if head then
    receivers = announce(channel .. ':' .. head, publish_commands())
    told = head
  end
end
return {removed, told, receivers, redis.call('LLEN', queue), held and 1 or 0, had_queue and 1 or 0}
