-- Fair lock: one acquire attempt (RFairLock layout, PROTOCOL 4), a compare-and-set on our hold
-- count, so sending the same attempt twice (a resend after a lost reply) never adds a second hold.
--
-- KEYS[1] owner hash NAME, KEYS[2] waiter queue, KEYS[3] deadline zset, KEYS[4] liveness zset,
-- KEYS[5] fencing counter, KEYS[6] grant requests hash
-- ARGV[1] lease in ms (the TTL of the owner hash is never shortened below it)
-- ARGV[2] owner field '<client uuid>:<holder id>'
-- ARGV[3] the hold count the caller believes Redis has for the field
-- ARGV[4] mode: 'try'     never join the queue (a zero wait)
--               'queue'   join at the tail when the lock cannot be taken (first attempt)
--               'requeue' a later attempt of a waiter that is still waiting: if a purge dropped it
--                         while it was alive, it goes back to the head it was removed from
-- ARGV[5] '1' to increment the fencing counter on a grant, '0' otherwise
-- ARGV[6] publish command ('PUBLISH' or 'SPUBLISH'), ARGV[7] release channel of this lock
-- ARGV[8] liveness window in ms, ARGV[9] the longest wait a Redisson client uses (ms)
-- ARGV[10] '0', or, when no other call of the field waits, the call's mark: a number drawn
--          from the same counter as the attempts' nonces, before any of this call's. An entry of
--          the field still queued whose grant request does not name an attempt numbered above
--          the mark was left by an ended call (its give-up failed), is not this call's place in
--          line, and is dropped first (the call joins at the tail). One that does was queued by
--          this call: by a send whose reply was lost, or by a first run of this very send (a
--          cluster client may run one send twice), and is kept.
-- ARGV[11] this attempt's nonce when the call takes a direct hand-off (PROTOCOL 8), '' when it
--          does not (then an entry of the field in G is dropped); an attempt that leaves the
--          field queued writes it into G, so a grant names the attempt it answers
-- ARGV[12] the TTL (ms) a direct grant gives the lock: the lease, but no longer than the
--          liveness window, so a waiter that died just before its grant holds the lock no
--          longer than a dead waiter blocks the queue; the waiter's client extends it to the
--          lease once it has the grant
--
-- Reply: {1, count, token}  granted or re-entered; count = our hold count now
--        {2, count, token}  the caller's count + 1 was already there: an earlier send of this
--                           attempt (or one whose reply was lost) took it; taken up, not added
--        {0, pos, hint, now} not granted; pos = our place in the queue (1 = head) when this
--                           attempt joined it at the tail, else 0; hint = how long (ms) the caller
--                           may sleep before the lock can change hands unannounced: the lock's
--                           PTTL when we are the head, the head's deadline when we are second, -1
--                           when a message or a heartbeat will tell us; now = the server time (ms)
--                           of this attempt, from which a direct grant's validity is counted.
-- token = the fencing counter after the grant (0 when not fenced).
-- A hold taken up gets a new token all the same: the hold found may be one an ended call of this
-- holder left behind (its release never reached Redis), whose guard was handed the token of its
-- grant; no two guards may ever show the same token. (A hold a lost reply hid skips the token
-- its grant drew, which nobody saw.)
--
-- Unlike RFairLock, taking the lock does not shift every other deadline (PROTOCOL 7, O(1) hot path):
-- our waiters refresh their own deadlines, and an unshifted Redisson deadline only makes it more
-- patient.

local name, queue, deadlines, liveness, token_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local grants = KEYS[6]
local lease, field, expected = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local mode, fenced = ARGV[4], ARGV[5] == '1'
local publish_cmd, channel_prefix = ARGV[6], ARGV[7]
local window, redisson_wait = tonumber(ARGV[8]), tonumber(ARGV[9])
local call_mark, nonce, grant_ttl = tonumber(ARGV[10]) or 0, ARGV[11], ARGV[12]
local drop_stale = call_mark > 0

local function granted(count)
  if fenced then
    return {1, count, next_token(token_key)}
  end
  return {1, count, 0}
end

-- 0. The uncontended path: no lock and nobody queued (one EXISTS for both keys). Nothing else
-- below can apply: no hold of ours to count, no entry of ours to drop, re-queue or refresh.
local found = redis.call('EXISTS', name, queue)
if found == 0 then
  redis.call('HSET', name, field, 1)
  redis.call('PEXPIRE', name, lease)
  return granted(1)
end

-- Everything above runs before the shared prologue's helpers are even defined (src/scripts.rs
-- puts the prologue at the marker below), so the uncontended path pays for none of them (only
-- the few count helpers in front, for an exact fencing token).
-- @prologue
-- Our hold count: a lock that does not exist holds nothing (no read needed on the free path).
-- Both keys found above: the lock exists.
local exists = found == 2 or redis.call('EXISTS', name) == 1
local held = exists and (tonumber(redis.call('HGET', name, field)) or 0) or 0

-- Sets the TTL to the lease unless the lock already lives longer (another hold of ours needs it).
local function extend()
  if redis.call('PTTL', name) < lease then
    redis.call('PEXPIRE', name, lease)
  end
end

-- Whether `field` is queued (has a score in Z), looked up at most once per run: the checks below
-- that need it set it when they change it.
local queued
local function is_queued()
  if queued == nil then
    queued = redis.call('ZSCORE', deadlines, field) ~= false
  end
  return queued
end

-- Dead waiters at the head go before anything reads the head (`look_at_head`), with one
-- exception: a call's first attempt that finds the lock held by someone else and waiters queued
-- (the contended join) cannot take the lock and joins the tail without reading the head. A dead
-- head blocks nobody while the lock is held, and whoever looks at the head next purges it: the
-- release that frees the lock (`pass_on`), the attempt of the waiter behind it once its deadline
-- lapses, a heartbeat, a Redisson client's script. (A resend of that first attempt, which finds
-- its entry queued, is answered like any queued attempt, from the head.)
local purged, head = 0, nil
local function look_at_head()
  local more
  more, head = purge_stale_head(queue, deadlines, liveness, grants)
  purged = purged + more
end
local behind_holder = found == 2 and held == 0 and mode == 'queue'
if not behind_holder then
  look_at_head()
end

-- A failed give-up left this field queued: a new call does not inherit that place. When the
-- entry was the head of a free lock, the new head is woken below like a purged one's. (An empty
-- queue holds no entry: the uncontended path pays no extra command.) The entry this call queued
-- itself, in an earlier send or an earlier run of this one, is its place and stays.
local function left_by_ended_call()
  local request = redis.call('HGET', grants, field)
  local of = request and tonumber(string.match(request, ':(%d+)$'))
  return not of or of <= call_mark
end
if drop_stale and held == 0 and (head or behind_holder) and is_queued()
    and left_by_ended_call() then
  leave_queue(queue, deadlines, liveness, grants, field)
  queued = false
  purged = purged + 1
  if not behind_holder then
    look_at_head()
  end
end
if behind_holder and is_queued() then
  look_at_head()
end

if held == expected + 1 then
  extend()
  return {2, held, fenced and next_token(token_key) or 0}
end

-- A waiter that is still waiting but is no longer queued, and whose tombstone is in L, was purged
-- as a dead head while it was alive (its mark lapsed, e.g. while Redis was unreachable). It was
-- the head then, so putting it back at the head restores the order everyone else already had.
-- Without a tombstone it did not leave as a head (a sibling call of its holder gave the shared
-- entry up, the holder was served meanwhile, the queue was lost): it rejoins at the tail below,
-- as a new arrival, so returning waiters keep their order and nobody is overtaken.
if mode == 'requeue' and head ~= field and held == 0 and not is_queued()
    and redis.call('ZSCORE', liveness, field) then
  local deadline = joining_deadline(name, queue, deadlines, liveness, field, window,
    redisson_wait, true)
  redis.call('LPUSH', queue, field)
  mark_alive(liveness, grants, field, window, deadline)
  redis.call('ZADD', deadlines, deadline, field)
  queued = true
  head = field
end

-- 1. Free and we are first in line (or nobody waits): take it.
if not exists and (not head or head == field) then
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, field)
    if redis.call('LLEN', queue) == 0 then
      redis.call('DEL', liveness, grants)
    else
      redis.call('ZREM', liveness, field)
      redis.call('HDEL', grants, field)
    end
  end
  redis.call('HSET', name, field, 1)
  redis.call('PEXPIRE', name, lease)
  return granted(1)
end

-- 2. Re-entry by the current owner.
if held > 0 then
  local count = redis.call('HINCRBY', name, field, 1)
  extend()
  return granted(count)
end

-- The lock stays with someone else; if purging made a different waiter the head of a free lock,
-- hand the lock on (grant it or wake the head) so a dead head never strands the queue.
if purged > 0 and head and head ~= field and not exists then
  if pass_on({name = name, queue = queue, deadlines = deadlines, liveness = liveness,
      grants = grants, token = token_key}, publish_cmd, channel_prefix) then
    exists = true
    head = redis.call('LINDEX', queue, 0)
  end
end

-- The head watches the lock's TTL (nobody announces an expiry). The waiter right behind the head
-- watches the head's deadline, so a head whose process died is purged the moment it lapses.
-- Everyone else is told by a message or by its heartbeat when its turn comes.
local function hint(second)
  if head == field or (mode == 'try' and not head) then
    return redis.call('PTTL', name)
  end
  if second == nil then
    second = head and redis.call('LINDEX', queue, 1) == field
  end
  if second then
    local until_ms = deadline_of(deadlines, liveness, head)
    if until_ms then
      return math.max(0, until_ms - server_now_ms())
    end
  end
  return -1
end

-- 3. Already queued: the attempt doubles as a heartbeat, when one is due (a re-check made
-- right after joining, or after a wake-up, finds the mark fresh and leaves it).
if is_queued() then
  local mark = redis.call('ZSCORE', liveness, field)
  if not mark or tonumber(mark) < server_now_ms() + window / 2 then
    local deadline = refreshed_deadline(queue, deadlines, liveness, field, window,
      redisson_wait)
    redis.call('ZADD', deadlines, 'XX', 'GT', deadline, field)
    mark_alive(liveness, grants, field, window, deadline)
  end
  -- The request names this attempt: a grant can only be taken up from its message by the
  -- client's latest attempt, never from an earlier grant of the same call whose hold vanished.
  if mode ~= 'try' then
    want_grant(liveness, grants, field, grant_ttl, fenced, nonce)
  end
  return {0, 0, hint(), server_now_ms()}
end

if mode == 'try' then
  return {0, 0, redis.call('PTTL', name), 0}
end

-- 4. Join the tail (the head when the queue was empty).
local deadline = joining_deadline(name, queue, deadlines, liveness, field, window,
  redisson_wait, false)
local position = redis.call('RPUSH', queue, field)
mark_alive(liveness, grants, field, window, deadline)
want_grant(liveness, grants, field, grant_ttl, fenced, nonce)
redis.call('ZADD', deadlines, deadline, field)
if position == 1 then
  head = field
elseif position == 2 and not head then
  -- The contended join did not read the head; the second watches it (a dead one lapses at once,
  -- and the next attempt, a queued one, purges it).
  head = redis.call('LINDEX', queue, 0)
end
return {0, position, hint(position == 2), server_now_ms()}
