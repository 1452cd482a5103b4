-- Inspection snapshot of one lock, either kind, taken atomically.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset
-- (the last three are empty for a non-fair lock)
--
-- Reply: {server now ms, PTTL of NAME, {field, count, ...} from HGETALL,
--         {field, deadline, liveness, ...} for every queued waiter in queue order (deadline -1 when
--         missing; liveness -1 for a waiter that is not fairlock's)}

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local waiters = {}
for _, field in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  local score = redis.call('ZSCORE', deadlines, field)
  local alive = redis.call('ZSCORE', liveness, field)
  waiters[#waiters + 1] = field
  waiters[#waiters + 1] = score and math.floor(tonumber(score)) or -1
  waiters[#waiters + 1] = alive and math.floor(tonumber(alive)) or -1
end
return {now, redis.call('PTTL', name), redis.call('HGETALL', name), waiters}
