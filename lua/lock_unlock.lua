-- Non-fair lock: release holds (PROTOCOL 3 unlock), a compare-and-set on our hold count
-- (`compare_release`, lua/release_prologue.lua), so sending the same release twice (a resend after
-- a lost reply) never releases twice, without any latch key.
--
-- KEYS[1] owner hash NAME
-- ARGV[1] owner field, ARGV[2] the hold count the caller believes Redis has for the field,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (its reply was lost): that hold is released too when it is there,
-- ARGV[5] the TTL (ms) the remaining holds need, -1 to leave the TTL as it is,
-- ARGV[6] publish command, ARGV[7] release channel
--
-- When holds remain and their TTL cuts the lock's by more than half (a watchdog hold released
-- while a short fixed one stays), '0' is published too: waiters sleep until the TTL an attempt
-- showed them, and the lock may now expire long before that (an expiry announces nothing).
--
-- Reply: {1, 0} released ('0' published on the release channel), {0, count} holds remain,
--        {2, 0} the lock no longer existed, {-1, 0} somebody else holds it,
--        {3, count} our count is not what the caller believes: nothing was changed.

local name = KEYS[1]

local held, by, reply = compare_release(name)
if reply then
  return reply
end
if held > by then
  redis.call('HINCRBY', name, field, -by)
  if set_remaining_ttl(name, remaining_ttl) then
    redis.call(publish_cmd, channel, '0')
  end
  return {0, held - by}
end
redis.call('DEL', name)
redis.call(publish_cmd, channel, '0')
return {1, 0}
