-- Fair lock: release one hold (PROTOCOL 4 unlock), idempotent per request id.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] unlock latch key
-- ARGV[1] lease in ms, re-applied when holds remain (the lease the lock was taken with)
-- ARGV[2] owner field
-- ARGV[3] publish command, ARGV[4] release channel of this lock, ARGV[5] latch lifetime (ms)
-- ARGV[6] '1' when the latch must be looked up: a retry of the same request, or any send on a
--         connection that may resend a request by itself (a cluster client); only then can the
--         latch be set already, so a first attempt elsewhere skips the lookup
--
-- Reply: 1 released (the head, if any, was told), 0 still held (one hold fewer),
--        2 the lock no longer existed (expired; treated as released, as RFairLock does, and the head
--          is told so a free lock never has a sleeping head), -1 held by someone else (not ours).

local name, queue, deadlines, latch = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lease, field = tonumber(ARGV[1]), ARGV[2]
local publish_cmd, channel_prefix, latch_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])

if ARGV[6] == '1' then
  local seen = latched_outcome(latch)
  if seen then
    return seen
  end
end

if redis.call('HEXISTS', name, field) == 0 then
  if redis.call('EXISTS', name) == 0 then
    wake_head(queue, deadlines, publish_cmd, channel_prefix, nil)
    return 2
  end
  return -1
end

if redis.call('HINCRBY', name, field, -1) > 0 then
  redis.call('PEXPIRE', name, lease)
  return remember_outcome(latch, 0, latch_ms)
end

redis.call('DEL', name)
wake_head(queue, deadlines, publish_cmd, channel_prefix, nil)
return remember_outcome(latch, 1, latch_ms)
