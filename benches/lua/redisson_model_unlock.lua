-- Baseline for benches/queue_depth.rs: a model, in our own words, of how a Redisson fair-lock
-- unlock behaves on the wire (PROTOCOL 4): purge expired heads with the caller's clock, release
-- one hold, and tell the head of the queue on its own channel. Not shipped.
--
-- KEYS[1] owner hash, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] release channel
-- ARGV[1] message ('0'), ARGV[2] lease ms, ARGV[3] owner field, ARGV[4] the caller's clock
-- Reply: 1 released (or already free), 0 still held, nil not the owner.

local owner, queue, deadlines, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local message, lease, me, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

local head = redis.call('LINDEX', queue, 0)
while head do
  local deadline = redis.call('ZSCORE', deadlines, head)
  if not deadline or tonumber(deadline) > now then
    break
  end
  redis.call('ZREM', deadlines, head)
  redis.call('LPOP', queue)
  head = redis.call('LINDEX', queue, 0)
end

local function tell_head()
  if head then
    redis.call('PUBLISH', channel .. ':' .. head, message)
  end
end

if redis.call('EXISTS', owner) == 0 then
  tell_head()
  return 1
end
if redis.call('HEXISTS', owner, me) == 0 then
  return nil
end
if redis.call('HINCRBY', owner, me, -1) > 0 then
  redis.call('PEXPIRE', owner, lease)
  return 0
end
redis.call('DEL', owner)
tell_head()
return 1
