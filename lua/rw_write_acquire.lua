-- Read-write lock, write side: one acquire attempt (RReadWriteLock layout, PROTOCOL 10), a
-- compare-and-set on our hold count, so sending the same attempt twice never adds a second hold.
--
-- KEYS[1] the lock hash NAME, KEYS[2] fencing counter
-- ARGV[1] lease in ms (the TTL is never shortened below it), ARGV[2] our write field
-- '<client uuid>:<holder id>:write', ARGV[3] the hold count the caller believes Redis has for it,
-- ARGV[4] '1' to increment the fencing counter on a grant, ARGV[5] our read field (the holder's
-- field without ':write')
--
-- Reply: {1, count, token} taken or re-entered; {2, count, token} the caller's count + 1 was
--        already there (taken up, not added); {0, 0, pttl} held by others (pttl: their remaining
--        TTL, -1 no expiry); {-2, 0, 0} refused: we hold it for reading only, and a writer would
--        wait for ever behind our own read holds (Redisson's upgrade self-deadlock).

local name, token_key = KEYS[1], KEYS[2]
local lease, field, expected = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local fenced, read_field = ARGV[4] == '1', ARGV[5]

local function token()
  if fenced then
    return redis.call('INCR', token_key)
  end
  return 0
end

local function extend()
  if redis.call('PTTL', name) < lease then
    redis.call('PEXPIRE', name, lease)
  end
end

local mode = redis.call('HGET', name, 'mode')
if mode == false then
  redis.call('HSET', name, 'mode', 'write', field, 1)
  redis.call('PEXPIRE', name, lease)
  return {1, 1, token()}
end
local held = tonumber(redis.call('HGET', name, field)) or 0
if held > 0 and held == expected + 1 then
  extend()
  return {2, held, fenced and (tonumber(redis.call('GET', token_key)) or 0) or 0}
end
if mode == 'write' and held > 0 then
  local count = redis.call('HINCRBY', name, field, 1)
  extend()
  return {1, count, token()}
end
if mode == 'read' and redis.call('HEXISTS', name, read_field) == 1 then
  return {-2, 0, 0}
end
return {0, 0, redis.call('PTTL', name)}
