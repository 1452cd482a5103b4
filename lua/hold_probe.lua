-- Reads what one holder has on a lock, so a caller whose acquire reply was lost (timeout, dropped
-- connection) can tell whether that attempt took the lock before it tries again. When Redis counts
-- more holds for the field than the caller does, the caller takes that grant up now: the lease is
-- applied again, so it runs from this call and not from the lost attempt, which may be long past.
-- KEYS[1] owner hash NAME, KEYS[2] fencing counter
-- ARGV[1] holder field, ARGV[2] holds the caller counts for it, ARGV[3] lease in ms
-- Reply: {hold count (0 when the field is absent), fencing counter value (0 when unset)}
local count = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
if count > tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local token = redis.call('GET', KEYS[2])
return {count, tonumber(token) or 0}
