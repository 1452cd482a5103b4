-- Fair lock: release holds (PROTOCOL 4 unlock), a compare-and-set on our hold count, so sending the
-- same release twice (a resend after a lost reply) never releases twice, without any latch key.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset
-- ARGV[1] owner field, ARGV[2] the hold count the caller believes Redis has for the field,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (its reply was lost): that hold is released too when it is there,
-- ARGV[5] the TTL (ms) the remaining holds need, -1 to leave the TTL as it is,
-- ARGV[6] publish command, ARGV[7] release channel of this lock
--
-- Reply: {1, 0}      released: the lock is free and the head of the queue, if any, was told
--        {0, count}  holds remain: `count` of them
--        {2, 0}      the lock no longer existed (it expired or was deleted; a fair lock treats
--                    this as released, as RFairLock does, and the head is told so a free lock
--                    never has a sleeping head)
--        {-1, 0}     somebody else holds the lock
--        {3, count}  our count is not what the caller believes: nothing was changed (a resend of a
--                    release that already ran, or a count the caller must learn first)

local name, queue, deadlines, liveness = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local field, expected, by = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local dark, remaining_ttl = ARGV[4] == '1', tonumber(ARGV[5])
local publish_cmd, channel_prefix = ARGV[6], ARGV[7]

local held = tonumber(redis.call('HGET', name, field)) or 0
if held == 0 then
  if redis.call('EXISTS', name) == 0 then
    wake_head(queue, deadlines, liveness, publish_cmd, channel_prefix)
    return {2, 0}
  end
  return {-1, 0}
end
if held ~= expected then
  if dark and held == expected + 1 then
    by = by + 1
  else
    return {3, held}
  end
end
if held > by then
  redis.call('HINCRBY', name, field, -by)
  if remaining_ttl > 0 then
    redis.call('PEXPIRE', name, remaining_ttl)
  end
  return {0, held - by}
end
redis.call('DEL', name)
wake_head(queue, deadlines, liveness, publish_cmd, channel_prefix)
return {1, 0}
