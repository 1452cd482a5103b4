-- Reads what one holder has on a lock, so a caller whose acquire reply was lost (timeout, dropped
-- connection) can tell whether that attempt took the lock before it tries again.
-- KEYS[1] owner hash NAME, KEYS[2] fencing counter
-- ARGV[1] holder field
-- Reply: {hold count (0 when the field is absent), fencing counter value (0 when unset)}
local count = redis.call('HGET', KEYS[1], ARGV[1])
local token = redis.call('GET', KEYS[2])
return {tonumber(count) or 0, tonumber(token) or 0}
