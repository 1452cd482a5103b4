-- Shared prologue of every fair-lock script (joined in front of each script at compile time by
-- src/scripts.rs, never pasted). It only defines local helpers; it touches no key by itself.
--
-- Keys of one fair lock (PROTOCOL 1): the owner hash NAME, the waiter queue Q (list), the deadline
-- zset Z (Redisson's), the fencing counter T, and fairlock's own keys: the liveness zset
-- L = fairlock_liveness:{NAME} and the grant requests hash G = fairlock_grants:{NAME}.
--
-- Invariants kept by every fair script:
-- * Q and Z hold the same members, and only the head of Q may take the lock.
-- * L holds the fairlock waiters that are queued (member = owner field, score = the server time by
--   which the waiter must show life again); a waiter leaves L when it leaves Q by itself (a grant,
--   a give-up). One exception: a waiter purged as a dead head keeps its lapsed mark for one more
--   window, as a tombstone: if it was in fact alive (its client could not reach Redis in time),
--   its next attempt finds the tombstone and rejoins at the head it was taken from. A waiter
--   missing from Q without a tombstone (a sibling call of its holder gave the shared entry up, it
--   was served, the queue was lost in a failover or a flush) rejoins at the tail.
--   Tombstones go with L when our scripts find the queue empty (a release, a give-up, a purge).
-- * A fairlock waiter is judged alive by its mark in L, never by its score in Z: Redisson clients
--   shift every score in Z on each of their acquisitions, ours included (PROTOCOL 4 and 7).
-- * G holds, for a queued fairlock waiter that can take a direct hand-off, what it asked for:
--   '<TTL ms>:<fenced 0|1>:<attempt nonce>' (written by each attempt that leaves it queued). A waiter leaves G whenever it leaves Q by our scripts;
--   G goes with L when the queue is found empty, and never outlives L (same TTL). When the lock
--   falls free and the live head has an entry in G, the script that freed it grants the lock to
--   that head itself (`pass_on`): the head is the owner before it hears of it (PROTOCOL 8).

-- The largest number of milliseconds a script writes (a score, a TTL). Lua hands numbers to Redis
-- with 14 significant digits, so 10^14 and more would arrive in exponent form, which PEXPIRE
-- rejects (after earlier writes of the script ran). Clients send no duration above 10^12 ms, but
-- sums such as one Redisson wait per waiter ahead can grow past that: they are capped here. A
-- capped deadline is still about 2,800 years away.
local MAX_MS = 90000000000000

local function capped(ms)
  return math.min(ms, MAX_MS)
end

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
-- Returns the number of waiters removed, the live head left (nil when the queue is empty) and
-- whether that head is a fairlock waiter (has a mark in L).
--
-- `first`, when given, is the head the caller has just read (LINDEX Q 0), so it is not read again.
local function purge_stale_head(queue, deadlines, liveness, grants, first)
  local removed = 0
  while true do
    local head = first or redis.call('LINDEX', queue, 0)
    first = nil
    if not head then
      if removed > 0 then
        redis.call('DEL', liveness, grants)
      end
      return removed, nil, false
    end
    local alive_until = redis.call('ZSCORE', liveness, head)
    local until_ms = alive_until or redis.call('ZSCORE', deadlines, head)
    if until_ms and tonumber(until_ms) > server_now_ms() then
      return removed, head, alive_until ~= false
    end
    redis.call('ZREM', deadlines, head)
    redis.call('LPOP', queue)
    if alive_until then
      redis.call('HDEL', grants, head)
    end
    -- A fairlock waiter's lapsed mark stays in L as its tombstone (see the invariants above);
    -- `sweep_liveness` drops it one window after it lapsed.
    removed = removed + 1
  end
end

-- When a waiter ahead of us must show life again (or acquire): its liveness mark if it is one of
-- ours, its deadline in Z otherwise. nil when it has neither.
local function deadline_of(deadlines, liveness, waiter)
  local until_ms = redis.call('ZSCORE', liveness, waiter) or redis.call('ZSCORE', deadlines, waiter)
  return until_ms and tonumber(until_ms)
end

-- How many of the first `place` waiters of the queue have no mark in L: those may be Redisson
-- waiters. Each such waiter ahead of a fairlock waiter can shift its score (by at most
-- `redisson_wait`, once, when it acquires or gives up); fairlock waiters shift nothing. Every
-- queued member is looked up in L (ZMSCORE, in chunks): counting `LLEN(Q) - ZCARD(L)` instead is
-- wrong, because a Redisson purge removes a waiter from Q and Z and leaves its mark in L. O(place).
local function unmarked_ahead(queue, liveness, place)
  local unmarked = 0
  local from = 0
  while from < place do
    local to = math.min(place, from + 500) - 1
    local members = redis.call('LRANGE', queue, from, to)
    if #members == 0 then
      break
    end
    local marks = redis.call('ZMSCORE', liveness, unpack(members))
    for i = 1, #members do
      if not marks[i] then
        unmarked = unmarked + 1
      end
    end
    from = to + 1
  end
  return unmarked
end

-- `unmarked_ahead` for a waiter about to join at the tail, which has every queued waiter ahead of
-- it. Q and Z hold the same waiters, so the count is |Z| - |Z ∩ L|, and ZINTERCARD (Redis 7.0+)
-- works that out in the server's C code instead of moving every member through Lua. On a server
-- without it, or when Q and Z disagree in size, the member-by-member count is used.
local function unmarked_in_queue(queue, deadlines, liveness, ahead)
  if ahead > 0 and redis.call('ZCARD', deadlines) == ahead then
    local marked = redis.pcall('ZINTERCARD', 2, deadlines, liveness)
    if type(marked) == 'number' then
      return ahead - marked
    end
  end
  return unmarked_ahead(queue, liveness, ahead)
end

-- The score a fairlock waiter at 0-based `place` in Q keeps in Z: far enough ahead that the
-- shifts of the Redisson waiters ahead of it cannot make it look expired before its next refresh
-- (nobody joins ahead of it later except a fairlock waiter put back at the head, which shifts
-- nothing). Refreshes only ever raise a score (ZADD GT).
local function protected_deadline(queue, liveness, place, window, redisson_wait)
  return capped(server_now_ms() + window + unmarked_ahead(queue, liveness, place) * redisson_wait)
end

-- The 0-based place of `field` in the queue (LPOS, O(place)); the queue length when absent.
local function place_of(queue, field)
  return redis.call('LPOS', queue, field) or redis.call('LLEN', queue)
end

-- The score a queued fairlock waiter `field` refreshes to (a heartbeat, or an attempt that
-- doubles as one): `protected_deadline` for its place, found in O(1) whenever no Redisson waiter
-- can be ahead of it, so a period of heartbeats costs O(waiters), not O(waiters^2).
--
-- Why the O(1) test is sound: the waiter's last refresh (or join) wrote mark m = t + window and a
-- score s >= m + U * redisson_wait, U being the Redisson waiters then ahead of it. Since then only
-- those U can have shifted s, each once (when it acquires or gives up) and by at most its own wait
-- (at most `redisson_wait`); nobody joins ahead of a queued waiter except a fairlock waiter put
-- back at the head, which shifts nothing. So s <= m means every one of the U has left and none is
-- ahead now: the count is 0 without walking the queue. (With redisson_wait = 0 the count does not
-- matter.) Otherwise it is counted member by member, O(place), as before; a refresh with no
-- Redisson waiter ahead writes s = m again, so a queue of fairlock waiters stays on this path.
local function refreshed_deadline(queue, deadlines, liveness, field, window, redisson_wait)
  local score = redis.call('ZSCORE', deadlines, field)
  local mark = score and redis.call('ZSCORE', liveness, field)
  if mark and tonumber(score) <= tonumber(mark) then
    return server_now_ms() + window
  end
  return protected_deadline(queue, liveness, place_of(queue, field), window, redisson_wait)
end

-- The score a waiter joining the queue gets: the protected deadline for its place, and, when
-- Redisson waiters are queued ahead, at least what Redisson's chain would give a waiter with
-- `redisson_wait` (the score of the tail it joins behind plus one wait), because a Redisson waiter
-- that later joins behind it chains its own deadline on this score. The chain is capped at what a
-- queue of this length could give a Redisson waiter (the lock's TTL plus one wait per waiter
-- ahead and its own): fairlock's hand-overs do not shift the scores behind them, so without the
-- cap the tail's score would grow by a wait with every join. A waiter put back at the head
-- (`at_head`) has nobody ahead: nothing can shift it and nothing chains on it. Call it before
-- pushing the waiter.
--
-- The Redisson waiters ahead of a joiner are those ahead of the tail, plus the tail when it is
-- one. When the tail is a fairlock waiter (it has a mark in L) whose score is not above its mark,
-- none is ahead of it: its last refresh wrote score = mark + (Redisson waiters then ahead) × a
-- wait > 0 (ZADD GT only raises that), nobody can join ahead of it but a fairlock waiter put back
-- at the head, and each Redisson waiter ahead that leaves shifts the score down once, by its own
-- wait, so score - mark stays above 0 while any is left. That O(1) test answers a queue of
-- fairlock waiters alone (where each score equals its mark); anything else is counted
-- (`unmarked_in_queue`, O(queue), whose cost on small sets grows with the square of the queue).
local function joining_deadline(name, queue, deadlines, liveness, field, window, redisson_wait,
    at_head)
  -- The tail alone tells an empty queue (no tail); the length is read only for the count.
  local tail = not at_head and redis.call('LINDEX', queue, -1)
  if not tail then
    return server_now_ms() + window
  end
  local score = tail ~= field and redis.call('ZSCORE', deadlines, tail)
  local mark = score and redis.call('ZSCORE', liveness, tail)
  if mark and tonumber(score) <= tonumber(mark) then
    return server_now_ms() + window
  end
  local ahead = redis.call('LLEN', queue)
  local redisson_ahead = unmarked_in_queue(queue, deadlines, liveness, ahead)
  local deadline = server_now_ms() + window + redisson_ahead * redisson_wait
  if redisson_ahead > 0 and score then
    local cap = server_now_ms() + window + math.max(0, redis.call('PTTL', name))
      + (ahead + 1) * redisson_wait
    deadline = math.max(deadline, math.min(tonumber(score) + redisson_wait, cap))
  end
  return capped(deadline)
end

-- Record that `field` (a queued fairlock waiter whose score in Z is `score`) is alive for
-- `window` ms more. L must outlive the score: while L exists, a fairlock waiter is judged by its
-- mark, so a waiter whose client died is purged within the window even when its score (which
-- carries Redisson's margins) is minutes away; were L to expire first, the waiter would be judged
-- by that score like a Redisson waiter. L's TTL is never shortened (clients may use different
-- windows; Redisson's shifts only lower scores). Our scripts delete L when the queue empties;
-- after a Redisson client empties it, L expires by itself. When L's TTL falls short it is set to
-- twice what is needed, so the waiters joining and refreshing after this one find it long enough
-- and pay one PTTL, not a PEXPIRE each.
-- G (the grant requests) is given the same TTL whenever L's is set, so it never outlives L.
local function mark_alive(liveness, grants, field, window, score)
  local now = server_now_ms()
  redis.call('ZADD', liveness, now + window, field)
  local needed = math.max(window, math.ceil(score - now))
  if redis.call('PTTL', liveness) < needed then
    redis.call('PEXPIRE', liveness, capped(2 * needed))
    redis.call('PEXPIRE', grants, capped(2 * needed))
  end
end

-- Records what a queued fairlock waiter asks for when the lock is handed to it directly (see G
-- above): call it after `mark_alive`. A G made here takes L's TTL (one made earlier has it).
-- With `nonce` = '' the waiter takes no direct hand-off (it is told '0' and acquires by itself):
-- an entry an earlier call of the field left is dropped.
local function want_grant(liveness, grants, field, ttl, fenced, nonce)
  if nonce == '' then
    redis.call('HDEL', grants, field)
    return
  end
  local fresh = redis.call('EXISTS', grants) == 0
  redis.call('HSET', grants, field, ttl .. ':' .. (fenced and '1' or '0') .. ':' .. nonce)
  if fresh then
    local ttl = redis.call('PTTL', liveness)
    if ttl > 0 then
      redis.call('PEXPIRE', grants, ttl)
    end
  end
end

-- After our script removed waiters: once nobody is queued, L and G have no live member and go.
local function forget_marks_if_empty(queue, liveness, grants)
  if redis.call('LLEN', queue) == 0 then
    redis.call('DEL', liveness, grants)
  end
end

-- Drop marks of waiters that are no longer queued once they lapsed more than one window ago:
-- tombstones of purged heads (our purge, or a Redisson client's, which removes them from Q and Z
-- but does not know L) are kept that long for the waiter's return. A lapsed mark of a waiter
-- still queued stays: the purge removes that waiter when it reaches the head. Bounded work per
-- call; run by heartbeats (every third of a window while any fairlock waiter waits), not on the
-- acquire path.
local function sweep_liveness(deadlines, liveness, window)
  local lapsed = redis.call('ZRANGEBYSCORE', liveness, '-inf', server_now_ms() - window,
    'LIMIT', 0, 8)
  for _, waiter in ipairs(lapsed) do
    if not redis.call('ZSCORE', deadlines, waiter) then
      redis.call('ZREM', liveness, waiter)
    end
  end
end

-- Take `field` out of the queue wherever it stands (Q, Z, L and G together).
local function leave_queue(queue, deadlines, liveness, grants, field)
  local was_queued = redis.call('ZREM', deadlines, field)
  redis.call('LREM', queue, 0, field)
  redis.call('ZREM', liveness, field)
  redis.call('HDEL', grants, field)
  if was_queued == 1 then
    forget_marks_if_empty(queue, liveness, grants)
  end
  return was_queued
end

-- Tell a waiter that the lock is free: PROTOCOL 2 payload '0' on its own channel (release channel
-- .. ':' .. owner field).
local function tell(publish_cmd, channel_prefix, waiter)
  redis.call(publish_cmd, channel_prefix .. ':' .. waiter, '0')
end

-- The lock is known to be free (NAME does not exist): drop dead heads, then hand it to the live
-- head. `k` holds the keys: name, queue, deadlines, liveness, grants, token.
--
-- A fairlock head with a request in G is granted the lock here (PROTOCOL 8): it leaves Q, Z, L
-- and G, becomes the owner with one hold and the TTL it asked for (its lease or its client's
-- watchdog timeout, at most its liveness window: its client extends it to the full lease once
-- it has the grant), gets a fencing token if it asked for one, and is told on its own channel
-- with 'fairlock:grant:<nonce>:<server ms>:<token>' (nonce: the attempt it answers; server ms:
-- the time of the grant, from which its client counts its validity). Any other head (a
-- Redisson waiter, a fairlock waiter that asked for no hand-off) is told '0' (PROTOCOL 2) and
-- acquires by itself. Returns the head that now owns the lock, or nil.
--
-- With nobody queued, L and G can hold only tombstones and stale requests (or marks a Redisson
-- purge left), which mean nothing for an empty queue (the tail is the head): they go, so a lock
-- that falls idle leaves nothing of ours behind for its TTL. (A grant to the last waiter needs no
-- such step: removing the only member of L and G deletes them.)
--
-- `first`: the head, when the caller has just read it.
local function pass_on(k, publish_cmd, channel_prefix, first)
  local _, head, ours = purge_stale_head(k.queue, k.deadlines, k.liveness, k.grants, first)
  if not head then
    redis.call('DEL', k.liveness, k.grants)
    return nil
  end
  local request = ours and redis.call('HGET', k.grants, head)
  local ttl, fenced, nonce
  if request then
    ttl, fenced, nonce = string.match(request, '^(%d+):([01]):(%d+)$')
  end
  if not nonce then
    tell(publish_cmd, channel_prefix, head)
    return nil
  end
  redis.call('LPOP', k.queue)
  redis.call('ZREM', k.deadlines, head)
  redis.call('ZREM', k.liveness, head)
  redis.call('HDEL', k.grants, head)
  redis.call('HSET', k.name, head, 1)
  redis.call('PEXPIRE', k.name, tonumber(ttl))
  local token = 0
  if fenced == '1' then
    token = next_token(k.token)
  end
  redis.call(publish_cmd, channel_prefix .. ':' .. head,
    'fairlock:grant:' .. nonce .. ':' .. count_text(server_now_ms()) .. ':' .. count_text(token))
  return head
end
