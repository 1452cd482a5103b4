-- Permit-expirable semaphore: the watchdog's renewal of one guard's permits (PROTOCOL 11): each
-- id's expiry becomes now + the lease, on the server's clock. Redisson has no such renewal; its
-- own updateLeaseTime does the same for one id.
--
-- KEYS[1] the permits' expiries `{NAME}:timeout`
-- ARGV[1] the lease in ms, ARGV[2..] the guard's permit ids (raw 16 bytes)
--
-- All or nothing: when one id is gone (reclaimed after it expired, or released by id elsewhere)
-- the guard has lost its permits and none is renewed (the rest expire with their lease).
--
-- Reply: 1 renewed, 0 a permit is gone.

local expiries, lease = KEYS[1], tonumber(ARGV[1])
for i = 2, #ARGV do
  if not redis.call('ZSCORE', expiries, ARGV[i]) then
    return 0
  end
end
local now = server_now_ms()
for i = 2, #ARGV do
  redis.call('ZADD', expiries, 'XX', now + lease, ARGV[i])
end
return 1
