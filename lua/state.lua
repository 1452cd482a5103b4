-- Inspection snapshot of one lock, either kind, taken atomically.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset (both empty for a non-fair lock)
--
-- Reply: {server now ms, PTTL of NAME, {field, count, ...} from HGETALL,
--         {field, deadline, ...} for every queued waiter in queue order (deadline -1 when missing)}

local name, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local waiters = {}
for _, field in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  local score = redis.call('ZSCORE', deadlines, field)
  waiters[#waiters + 1] = field
  waiters[#waiters + 1] = score and math.floor(tonumber(score)) or -1
end
return {now, redis.call('PTTL', name), redis.call('HGETALL', name), waiters}
