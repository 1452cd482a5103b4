-- Read-write lock: an inspection snapshot, taken atomically (RReadWriteLock layout, PROTOCOL 10).
--
-- KEYS[1] the lock hash NAME, KEYS[2] the base the lease keys are named from (`{NAME}`, or NAME
-- when it has a hash tag)
--
-- Reply: {server now ms, PTTL of NAME, mode ('' when free), {{field, count, {lease key PTTL, ...}},
--         ...}}: every holder field (the `mode` field left out) with its hold count and the PTTL of
--         each of its lease keys 1..count (-2 for one that is gone; a write field has none).

local name, base = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = redis.call('HGET', name, 'mode') or ''

local holders = {}
local all = redis.call('HGETALL', name)
for i = 1, #all, 2 do
  local field, count = all[i], tonumber(all[i + 1])
  if field ~= 'mode' and count then
    local leases = {}
    if string.sub(field, -6) ~= ':write' then
      local keys = base .. ':' .. field .. ':rwlock_timeout:'
      for k = 1, count do
        leases[k] = redis.call('PTTL', keys .. k)
      end
    end
    holders[#holders + 1] = {field, count, leases}
  end
end
return {now, redis.call('PTTL', name), mode, holders}
