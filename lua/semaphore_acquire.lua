-- Semaphore: take permits when enough are available (RSemaphore layout, PROTOCOL 11). The count
-- is a plain string; a missing key holds no permits.
--
-- KEYS[1] the semaphore NAME, KEYS[2] this call's mark (`{NAME}:fairlock_call:<call id>`)
-- ARGV[1] how many permits (>= 1), ARGV[2] how long the mark lives (ms)
--
-- The mark makes the call's outcome knowable after a lost reply: 'taken' when this call took its
-- permits, 'void' when semaphore_give_back.lua ran first (the call must then take nothing).
--
-- Reply: 1 the permits are ours, 0 not enough available (nothing changed), -1 the call was
--        given up before it ran (nothing changed).

local name, mark = KEYS[1], KEYS[2]
local wanted, mark_ms = tonumber(ARGV[1]), ARGV[2]

local done = redis.call('GET', mark)
if done == 'taken' then
  return 1
elseif done then
  return -1
end
local available = tonumber(redis.call('GET', name) or '0')
if available == nil then
  return redis.error_reply('ERR fairlock: semaphore ' .. name .. ' does not hold a number')
end
if available < wanted then
  return 0
end
redis.call('DECRBY', name, wanted)
redis.call('SET', mark, 'taken', 'PX', mark_ms)
return 1
