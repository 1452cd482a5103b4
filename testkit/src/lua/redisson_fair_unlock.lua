-- Test peer, fair lock: release one hold (PROTOCOL 4 unlock).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset
-- ARGV[1] lease ms (re-applied while holds remain), ARGV[2] owner field,
-- ARGV[3] release channel of the lock (the head is told on release channel .. ':' .. its field),
-- ARGV[4] now (epoch ms)
--
-- Reply: 1 released (or the lock had expired already), 0 still held, -1 not the owner.

local name, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local lease, me, channel, now = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])

drop_expired_front(queue, deadlines, now)

local function tell_front()
  local front = redis.call('LINDEX', queue, 0)
  if front then
    redis.call('PUBLISH', channel .. ':' .. front, '0')
  end
end

if redis.call('EXISTS', name) == 0 then
  tell_front()
  return 1
end
if redis.call('HEXISTS', name, me) == 0 then
  return -1
end
if redis.call('HINCRBY', name, me, -1) > 0 then
  redis.call('PEXPIRE', name, lease)
  return 0
end
redis.call('DEL', name)
tell_front()
return 1
