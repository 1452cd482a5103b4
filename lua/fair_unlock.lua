-- Fair lock: release holds (PROTOCOL 4 unlock), a compare-and-set on our hold count
-- (`compare_release`, lua/release_prologue.lua), so sending the same release twice (a resend after
-- a lost reply) never releases twice, without any latch key.
-- The last release hands the lock on (`pass_on`): to a fairlock head that asked for it directly
-- (PROTOCOL 8), otherwise by telling the head.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset,
-- KEYS[5] grant requests hash, KEYS[6] fencing counter
-- ARGV[1] owner field, ARGV[2] the hold count the caller believes Redis has for the field,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (its reply was lost): that hold is released too when it is there,
-- ARGV[5] the TTL (ms) the remaining holds need, -1 to leave the TTL as it is,
-- ARGV[6] publish command, ARGV[7] release channel of this lock
--
-- When holds remain and their TTL cuts the lock's by more than half (a watchdog hold released
-- while a short fixed one stays), the head is told ('0'): it sleeps until the TTL its last attempt
-- saw, and the lock may now expire long before that (an expiry announces nothing).
--
-- Reply: {1, 0}      released: the lock is free or handed to the head of the queue, if any
--        {0, count}  holds remain: `count` of them
--        {2, 0}      the lock no longer existed (it expired or was deleted; a fair lock treats
--                    this as released, as RFairLock does, and it is handed on so a free lock
--                    never has a sleeping head)
--        {-1, 0}     somebody else holds the lock
--        {3, count}  our count is not what the caller believes: nothing was changed (a resend of a
--                    release that already ran, or a count the caller must learn first)

local k = {name = KEYS[1], queue = KEYS[2], deadlines = KEYS[3], liveness = KEYS[4],
  grants = KEYS[5], token = KEYS[6]}
local channel_prefix = channel

local held, by, reply = compare_release(k.name)
-- The reply once the lock is handed on (below the fair prologue), the head if already read, and
-- whether holds remain under a TTL cut by more than half (the head is told, below).
local outcome, head, cut
if reply and reply[1] ~= 2 then
  return reply
end
if reply then
  -- The lock no longer exists: hand it on all the same, so a free lock never has a sleeping head.
  outcome = reply
else
  if held > by then
    redis.call('HINCRBY', k.name, field, -by)
    cut = set_remaining_ttl(k.name, remaining_ttl)
    if not cut then
      return {0, held - by}
    end
    outcome = {0, held - by}
  else
    -- The uncontended path: nobody queued, so the lock and whatever L and G still hold go in
    -- one DEL.
    head = redis.call('LINDEX', k.queue, 0)
    if head == false then
      redis.call('DEL', k.name, k.liveness, k.grants)
      return {1, 0}
    end
    redis.call('DEL', k.name)
    outcome = {1, 0}
  end
end
-- Everything above runs before the shared prologue's helpers are even defined (src/scripts.rs
-- puts the prologue at the marker below): only a hand-over needs them.
-- @prologue
if cut then
  head = redis.call('LINDEX', k.queue, 0)
  if head then
    tell(publish_cmd, channel_prefix, head)
  end
  return outcome
end
pass_on(k, publish_cmd, channel_prefix, head or nil)
return outcome
