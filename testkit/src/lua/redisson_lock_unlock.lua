-- Test peer, non-fair lock: release one hold (PROTOCOL 3 unlock).
--
-- KEYS[1] owner hash NAME; ARGV[1] lease ms (re-applied while holds remain), ARGV[2] owner field,
-- ARGV[3] release channel
--
-- Reply: 1 released (and '0' published on the release channel), 0 still held, -1 not the owner.

local name = KEYS[1]
local lease, me, channel = tonumber(ARGV[1]), ARGV[2], ARGV[3]

if redis.call('HEXISTS', name, me) == 0 then
  return -1
end
if redis.call('HINCRBY', name, me, -1) > 0 then
  redis.call('PEXPIRE', name, lease)
  return 0
end
redis.call('DEL', name)
redis.call('PUBLISH', channel, '0')
return 1
