-- Test peer, non-fair lock: one acquire poll of a Java thread (PROTOCOL 3 acquire).
--
-- KEYS[1] owner hash NAME, KEYS[2] fencing counter
-- ARGV[1] lease ms, ARGV[2] owner field
--
-- Reply: {1, token} granted or re-entered (the fencing counter is bumped on every grant);
--        {0, pttl} held by someone else, with the holder's remaining TTL.

local name, counter = KEYS[1], KEYS[2]
local lease, me = tonumber(ARGV[1]), ARGV[2]

if redis.call('EXISTS', name) == 0 or redis.call('HEXISTS', name, me) == 1 then
  redis.call('HINCRBY', name, me, 1)
  redis.call('PEXPIRE', name, lease)
  -- Read back as text: the INCR's reply passes through a Lua number, rounded beyond 2^53.
  redis.call('INCR', counter)
  return {1, redis.call('GET', counter)}
end
return {0, redis.call('PTTL', name)}
