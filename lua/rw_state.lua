-- Read-write lock: an inspection snapshot, taken atomically (RReadWriteLock layout, PROTOCOL 10).
--
-- KEYS[1] the lock hash NAME, KEYS[2] the base the lease keys are named from (`{NAME}`, or NAME
-- when it has a hash tag), KEYS[3] the writer-preferring arrival queue, KEYS[4] its liveness marks
--
-- Reply: {server now ms, PTTL of NAME, mode ('' when free), {{field, count, {lease key PTTL, ...}},
--         ...}, {{field, liveness mark ms (-1 none)}, ...}}: every holder field (the `mode` field
--         left out) with its hold count and the PTTL of each of its lease keys 1..count (-2 for
--         one that is gone; a write field has none), then the writer-preferring waiters in
--         arrival order.

local name, base, queue, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
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
local waiters = {}
for _, field in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  local mark = redis.call('ZSCORE', live, field)
  waiters[#waiters + 1] = {field, mark and math.floor(tonumber(mark)) or -1}
end
return {now, redis.call('PTTL', name), mode, holders, waiters}
