-- Non-fair lock: release one hold (PROTOCOL 3 unlock), idempotent per request id.
--
-- KEYS[1] owner hash NAME, KEYS[2] unlock latch key of this request
-- ARGV[1] lease in ms, re-applied when holds remain, ARGV[2] owner field
-- ARGV[3] publish command, ARGV[4] release channel, ARGV[5] how long the latch is kept (ms)
-- ARGV[6] '1' when the latch must be looked up: a retry of the same request, or any send on a
--         connection that may resend a request by itself (a cluster client); only then can the
--         latch be set already, so a first attempt elsewhere skips the lookup
--
-- Reply: 1 released (and '0' published on the release channel), 0 still held (one hold fewer),
--        -1 not ours (someone else holds it, or nobody: an expired RLock is not ours any more).

local name, latch = KEYS[1], KEYS[2]
local lease, field = tonumber(ARGV[1]), ARGV[2]
local publish_cmd, channel, latch_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])

if ARGV[6] == '1' then
  local seen = latched_outcome(latch)
  if seen then
    return seen
  end
end
if redis.call('HEXISTS', name, field) == 0 then
  return -1
end
if redis.call('HINCRBY', name, field, -1) > 0 then
  redis.call('PEXPIRE', name, lease)
  return remember_outcome(latch, 0, latch_ms)
end
redis.call('DEL', name)
redis.call(publish_cmd, channel, '0')
return remember_outcome(latch, 1, latch_ms)
