-- Shared prologue of every fair-lock script (joined in front of each script at compile time by
-- src/scripts.rs, never pasted). It only defines local helpers; it touches no key by itself.
--
-- Keys of one fair lock (PROTOCOL 1): the owner hash NAME, the waiter queue Q (list), the deadline
-- zset Z (Redisson's), and fairlock's own liveness zset L = fairlock_liveness:{NAME}.
--
-- Invariants kept by every fair script:
-- * Q and Z hold the same members, and only the head of Q may take the lock.
-- * L holds exactly the fairlock waiters that are queued (member = owner field, score = the server
--   time by which the waiter must show life again); a waiter leaves L when it leaves Q.
-- * A fairlock waiter is judged alive by its mark in L, never by its score in Z: Redisson clients
--   shift every score in Z on each of their acquisitions, ours included (PROTOCOL 4 and 7).

-- Current time in Unix epoch milliseconds from the server clock (PROTOCOL 7: fairlock clients never
-- pass their own clock, so they never disagree about deadlines). Read at most once per script run,
-- and only when a deadline is actually compared or written: the uncontended path never needs it.
local cached_now
local function server_now_ms()
  if not cached_now then
    local t = redis.call('TIME')
    cached_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return cached_now
end

-- Remove waiters at the head of the queue that are dead. A fairlock waiter (one with a mark in L)
-- is dead once its liveness mark lapsed, whatever its score in Z says; any other waiter (a
-- Redisson one) once its score in Z lapsed. A head with neither a mark nor a score cannot belong
-- to a live waiter of either client (both always write them together) and would block the queue
-- for ever, so it is treated as dead. Only the head is examined, as Redisson does, so the cost is
-- proportional to the number of dead waiters removed, not to the queue length.
-- Returns the number of waiters removed and the live head left (nil when the queue is empty).
local function purge_stale_head(queue, deadlines, liveness)
  local removed = 0
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return removed, nil
    end
    local alive_until = redis.call('ZSCORE', liveness, head)
    local until_ms = alive_until or redis.call('ZSCORE', deadlines, head)
    if until_ms and tonumber(until_ms) > server_now_ms() then
      return removed, head
    end
    redis.call('ZREM', deadlines, head)
    redis.call('LPOP', queue)
    if alive_until then
      redis.call('ZREM', liveness, head)
    end
    removed = removed + 1
  end
end

-- When a waiter ahead of us must show life again (or acquire): its liveness mark if it is one of
-- ours, its deadline in Z otherwise. nil when it has neither.
local function deadline_of(deadlines, liveness, waiter)
  local until_ms = redis.call('ZSCORE', liveness, waiter) or redis.call('ZSCORE', deadlines, waiter)
  return until_ms and tonumber(until_ms)
end

-- The score a fairlock waiter keeps in Z: far enough ahead that Redisson's shifts cannot make it
-- look expired before the waiter's next refresh. Only a Redisson waiter *ahead* of it can shift
-- it (by at most `redisson_wait`, once, when that waiter acquires or gives up), and nobody joins
-- ahead of it later except a fairlock waiter put back at the head (which shifts nothing). So every
-- waiter ahead is counted as a possible Redisson one. (Counting waiters without a mark in L would
-- be tighter but is not safe: a Redisson purge removes a waiter from Q and Z and leaves its mark
-- in L, and such stale marks would make the count too small.) `ahead` is the waiter's 0-based place
-- in Q. Refreshes only ever raise a score (ZADD GT).
local function protected_deadline(ahead, window, redisson_wait)
  return server_now_ms() + window + ahead * redisson_wait
end

-- The 0-based place of `field` in the queue (LPOS, O(place)); the queue length when absent.
local function place_of(queue, field)
  return redis.call('LPOS', queue, field) or redis.call('LLEN', queue)
end

-- The score a waiter joining the queue gets: the protected deadline for its place, and, when it
-- joins behind anyone, at least what Redisson's chain would give a waiter with `redisson_wait`
-- (the score of the tail it joins behind plus one wait): a Redisson waiter that later joins
-- behind it chains its own deadline on this score. A waiter put back at the head (`at_head`) has
-- nobody ahead, so nothing can shift it and nothing chains on it. Call it before pushing the
-- waiter. Also returns how many marks L had (the join creates L when there were none).
local function joining_deadline(queue, deadlines, liveness, field, window, redisson_wait, at_head)
  local marks = redis.call('ZCARD', liveness)
  if at_head then
    return protected_deadline(0, window, redisson_wait), marks
  end
  local ahead = redis.call('LLEN', queue)
  local deadline = protected_deadline(ahead, window, redisson_wait)
  local tail = ahead > 0 and redis.call('LINDEX', queue, -1)
  if tail and tail ~= field then
    local score = redis.call('ZSCORE', deadlines, tail)
    if score then
      deadline = math.max(deadline, tonumber(score) + redisson_wait)
    end
  end
  return deadline, marks
end

-- Record that `field` (a queued fairlock waiter) is alive for `window` ms more, and keep L alive at
-- least that long: L expires by itself once no fairlock waiter refreshes it (every mark in it has
-- lapsed by then), so a crashed client never leaves it behind. Its TTL is never shortened, since
-- clients may use different windows.
local function mark_alive(liveness, field, window)
  redis.call('ZADD', liveness, server_now_ms() + window, field)
  if redis.call('PTTL', liveness) < window then
    redis.call('PEXPIRE', liveness, window)
  end
end

-- Marks a waiter that joins the queue. The set's TTL is set here only when the join created the
-- set (`others` is the number of marks before it); otherwise the heartbeats keep it, and until
-- the first one the waiter's protected score in Z already keeps it from being purged.
local function mark_joined(liveness, field, window, marks_before)
  redis.call('ZADD', liveness, server_now_ms() + window, field)
  if marks_before == 0 then
    redis.call('PEXPIRE', liveness, window)
  end
end

-- Drop lapsed marks of waiters that are no longer queued (a Redisson client's purge removed them
-- from Q and Z, but it does not know L). A lapsed mark of a waiter still queued stays: the purge
-- removes that waiter when it reaches the head. Bounded work per call; run by heartbeats (every
-- third of a window while any fairlock waiter waits), not on the acquire path.
local function sweep_liveness(deadlines, liveness)
  local lapsed = redis.call('ZRANGEBYSCORE', liveness, '-inf', server_now_ms(), 'LIMIT', 0, 8)
  for _, waiter in ipairs(lapsed) do
    if not redis.call('ZSCORE', deadlines, waiter) then
      redis.call('ZREM', liveness, waiter)
    end
  end
end

-- Take `field` out of the queue wherever it stands (Q, Z and L together).
local function leave_queue(queue, deadlines, liveness, field)
  local was_queued = redis.call('ZREM', deadlines, field)
  redis.call('LREM', queue, 0, field)
  redis.call('ZREM', liveness, field)
  return was_queued
end

-- Tell a waiter that the lock is free: PROTOCOL 2 payload '0' on its own channel (release channel
-- .. ':' .. owner field).
local function tell(publish_cmd, channel_prefix, waiter)
  redis.call(publish_cmd, channel_prefix .. ':' .. waiter, '0')
end

-- The lock is known to be free: drop dead heads, then tell the live head, if any.
local function wake_head(queue, deadlines, liveness, publish_cmd, channel_prefix)
  local _, head = purge_stale_head(queue, deadlines, liveness)
  if head then
    tell(publish_cmd, channel_prefix, head)
  end
end
