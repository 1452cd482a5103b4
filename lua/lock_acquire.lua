-- Non-fair lock: one acquire attempt (RLock layout, PROTOCOL 3), a compare-and-set on our hold
-- count, so sending the same attempt twice (a resend after a lost reply) never adds a second hold.
--
-- KEYS[1] owner hash NAME, KEYS[2] fencing counter
-- ARGV[1] lease in ms (the TTL is never shortened below it), ARGV[2] owner field,
-- ARGV[3] the hold count the caller believes Redis has for the field,
-- ARGV[4] '1' to increment the fencing counter on a grant
--
-- Reply: {1, count, token} granted or re-entered; count = our hold count now,
--        {2, count, token} the caller's count + 1 was already there: an earlier send of this
--                          attempt (or one whose reply was lost) took it; taken up, not added,
--        {0, 0, pttl}      held by someone else; pttl is the holder's remaining TTL (-1: no expiry).
-- token = the fencing counter after the grant (0 when not fenced).
-- A hold taken up gets a new token all the same: the hold found may be one an ended call of this
-- holder left behind (its release never reached Redis), whose guard was handed the token of its
-- grant; no two guards may ever show the same token. (A hold a lost reply hid skips the token
-- its grant drew, which nobody saw.)

local name, token_key = KEYS[1], KEYS[2]
local lease, field, expected = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local fenced = ARGV[4] == '1'

local held = tonumber(redis.call('HGET', name, field)) or 0

local function extend()
  if redis.call('PTTL', name) < lease then
    redis.call('PEXPIRE', name, lease)
  end
end

if held == expected + 1 then
  extend()
  return {2, held, fenced and next_token(token_key) or 0}
end
if held > 0 or redis.call('EXISTS', name) == 0 then
  local count = redis.call('HINCRBY', name, field, 1)
  if count == 1 then
    redis.call('PEXPIRE', name, lease)
  else
    extend()
  end
  if fenced then
    return {1, count, next_token(token_key)}
  end
  return {1, count, 0}
end
return {0, 0, redis.call('PTTL', name)}
