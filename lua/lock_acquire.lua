-- Non-fair lock: one acquire attempt (RLock layout, PROTOCOL 3).
--
-- KEYS[1] owner hash NAME, KEYS[2] fencing counter
-- ARGV[1] lease in ms, ARGV[2] owner field, ARGV[3] '1' to increment the fencing counter on success
--
-- Reply: {1, token} acquired or re-entered (token = fencing counter value, 0 when not fenced),
--        {0, pttl} held by someone else; pttl is the holder's remaining TTL (-1: no expiry).

local name, token_key = KEYS[1], KEYS[2]
local lease, field, fenced = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'

if redis.call('EXISTS', name) == 0 or redis.call('HEXISTS', name, field) == 1 then
  redis.call('HINCRBY', name, field, 1)
  redis.call('PEXPIRE', name, lease)
  if fenced then
    return {1, redis.call('INCR', token_key)}
  end
  return {1, 0}
end
return {0, redis.call('PTTL', name)}
