-- Permit-expirable semaphore: take permits, each under its own id with an expiry
-- (RPermitExpirableSemaphore layout, PROTOCOL 11). Expiries are decided on the server's clock.
--
-- KEYS[1] the semaphore NAME (available count), KEYS[2] the permits' expiries `{NAME}:timeout`
-- (sorted set: raw 16-byte permit id, expiry in ms since the epoch)
-- ARGV[1] how many permits (>= 1), ARGV[2] their lease in ms, ARGV[3] publish command,
-- ARGV[4] the semaphore's channel, ARGV[5] '1' when this may be a resend of a call already sent
-- ('0' on its first send, unless the connection may run one send twice: a cluster's),
-- ARGV[6..] the permit ids (raw 16 bytes each, one per permit)
--
-- A resend of a call whose first send took its permits finds its first id there and takes
-- nothing more (a first send that runs once cannot: its ids are new, so it does not look). Permits whose expiry
-- passed are reclaimed first (as many as asked for, as Redisson does), and their return
-- published; the earliest expiry, read for that, is also the reply's hint when too few are left. A Redisson permit taken without a lease has the score
-- 922337203685477 and never expires.
--
-- Reply: {1, 0} the permits are ours; {0, ms} not enough available, the earliest expiry is in ms
--        (a waiter looks again then); {0, -1} not enough, and no expiry is coming.

local name, expiries = KEYS[1], KEYS[2]
local wanted, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local publish_cmd, channel = ARGV[3], ARGV[4]
local forever = 922337203685477

if ARGV[5] == '1' and redis.call('ZSCORE', expiries, ARGV[6]) then
  return {1, 0}
end

local now = server_now_ms()

-- The earliest expiry: nothing to reclaim unless it has passed.
local first = redis.call('ZRANGE', expiries, 0, 0, 'WITHSCORES')
if first[1] and tonumber(first[2]) <= now then
  reclaim_expired(name, expiries, now, wanted, publish_cmd, channel)
  first = nil
end

local available, bad = available_count(name)
if bad then
  return bad
end
if available >= wanted then
  redis.call('DECRBY', name, wanted)
  for i = 6, #ARGV do
    redis.call('ZADD', expiries, now + lease, ARGV[i])
  end
  local ttl = redis.call('PTTL', name)
  if ttl > 0 then
    redis.call('PEXPIRE', expiries, ttl)
  end
  return {1, 0}
end

if first == nil then
  first = redis.call('ZRANGE', expiries, 0, 0, 'WITHSCORES')
end
if first[1] and tonumber(first[2]) ~= forever then
  return {0, math.max(tonumber(first[2]) - now, 0)}
end
return {0, -1}
