-- Fair lock: one acquire attempt (RFairLock layout, PROTOCOL 4).
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] fencing counter
-- ARGV[1] lease in ms (PEXPIRE of the owner hash on success)
-- ARGV[2] owner field '<client uuid>:<holder id>'
-- ARGV[3] liveness window in ms: our deadline in the zset is now + this, refreshed while we wait
-- ARGV[4] mode: 'try'     never join the queue (a zero wait)
--               'queue'   join at the tail when the lock cannot be taken (first attempt)
--               'requeue' a later attempt of a waiter that is still waiting: if a purge dropped it
--                         while it was alive, it goes back to the head it was removed from
-- ARGV[5] '1' to increment the fencing counter on success, '0' otherwise
-- ARGV[6] publish command ('PUBLISH' or 'SPUBLISH'), ARGV[7] release channel of this lock
--
-- Reply: {1, token} acquired (token = fencing counter value, 0 when not fenced), or
--        {0, hint} not acquired, where hint is how long (ms) the caller may sleep before the lock can
--        change hands without anyone telling it: the lock's PTTL when we are the head, the head's
--        deadline when we are second, -1 when a message or a heartbeat report will tell us.
--
-- Unlike RFairLock, taking the lock does not shift every other deadline (PROTOCOL 7, O(1) hot path):
-- our waiters refresh their own deadlines, and an unshifted Java deadline only makes it more patient.

local name, queue, deadlines, token_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lease, field, liveness = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local mode, fenced = ARGV[4], ARGV[5] == '1'
local publish_cmd, channel_prefix = ARGV[6], ARGV[7]

local purged, head = purge_stale_head(queue, deadlines)

local function granted()
  redis.call('PEXPIRE', name, lease)
  if fenced then
    return {1, redis.call('INCR', token_key)}
  end
  return {1, 0}
end

-- A waiter that is still waiting but is no longer queued was removed as a stale head (its deadline
-- lapsed, e.g. while Redis was unreachable). It was the head then, so putting it back at the head
-- restores the order everyone else already had.
if mode == 'requeue' and head ~= field and redis.call('HEXISTS', name, field) == 0
    and not redis.call('ZSCORE', deadlines, field) then
  redis.call('ZADD', deadlines, server_now_ms() + liveness, field)
  redis.call('LPUSH', queue, field)
  head = field
end

-- 1. Free and we are first in line (or nobody waits): take it. (An empty queue means an empty
-- deadline set: the two always hold the same members.)
if redis.call('EXISTS', name) == 0 and (not head or head == field) then
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, field)
  end
  redis.call('HSET', name, field, 1)
  return granted()
end

-- 2. Re-entry by the current owner.
if redis.call('HEXISTS', name, field) == 1 then
  redis.call('HINCRBY', name, field, 1)
  return granted()
end

-- The lock stays with someone else; if purging made a different waiter the head of a free lock,
-- wake it so a dead head never strands the queue.
if purged > 0 and head and head ~= field and redis.call('EXISTS', name) == 0 then
  tell(publish_cmd, channel_prefix, head)
end

-- The head must watch the lock's TTL (nobody announces an expiry). The waiter right behind the
-- head watches the head's deadline, so a head whose process died is purged the moment it lapses.
-- Everyone else is told by a message or by its heartbeat when its turn comes.
local function hint()
  if head == field or (mode == 'try' and not head) then
    return redis.call('PTTL', name)
  end
  if head and redis.call('LINDEX', queue, 1) == field then
    local head_deadline = redis.call('ZSCORE', deadlines, head)
    if head_deadline then
      return math.max(0, tonumber(head_deadline) - server_now_ms())
    end
  end
  return -1
end

-- 3. Already queued: refresh our deadline (the attempt doubles as a heartbeat).
if redis.call('ZSCORE', deadlines, field) then
  redis.call('ZADD', deadlines, 'XX', server_now_ms() + liveness, field)
  return {0, hint()}
end

if mode == 'try' then
  return {0, redis.call('PTTL', name)}
end

-- 4. Join the tail (the head when the queue was empty).
redis.call('ZADD', deadlines, server_now_ms() + liveness, field)
redis.call('RPUSH', queue, field)
if not head then
  head = field
end
return {0, hint()}
