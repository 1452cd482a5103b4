-- Shared helpers of the read-write lock's writer-preferring queue (PROTOCOL 10), joined in front
-- of the scripts that use it (src/scripts.rs). Local functions only.
--
-- The queue is fairlock's own and only writer-preferring fairlock waiters use it; Redisson and
-- fairlock's default handles never look at it. q.queue: sorted set, owner field -> arrival number;
-- q.writers: the writers among them (same numbers); q.live: sorted set, owner field -> the server
-- time (ms) by which the waiter must show life again (its attempts and its client's heartbeats
-- move it on); q.seq: the arrival counter. All four live in the lock's slot and are deleted when
-- the queue empties; otherwise their TTL outlasts every mark by a window, so a queue whose
-- waiters all died expires by itself.
--
-- Invariant: a queued reader may enter only when no writer arrived before it; a queued writer only
-- at the head; a waiter that is not queued only when the queue is empty. A field that already
-- holds the lock (a re-entry, or a writer's holder taking the read side) bypasses the queue, or a
-- writer queued behind it would wait for ever.

local function rw_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Removes every waiter whose mark lapsed. Returns how many.
local function rw_purge(q, now)
  local dead = redis.call('ZRANGEBYSCORE', q.live, '-inf', '(' .. now)
  for _, field in ipairs(dead) do
    redis.call('ZREM', q.queue, field)
    redis.call('ZREM', q.writers, field)
    redis.call('ZREM', q.live, field)
  end
  return #dead
end

-- Deletes the queue's keys once nobody is queued.
local function rw_tidy(q)
  if redis.call('ZCARD', q.queue) == 0 then
    redis.call('DEL', q.queue, q.writers, q.live, q.seq)
  end
end

-- Whether `field` may try the lock now (see the invariant above). `seq`: its arrival number
-- (`ZSCORE` of q.queue, read by the caller), false when it is not queued.
local function rw_turn(q, field, writer, seq)
  if not seq then
    return redis.call('EXISTS', q.queue) == 0
  end
  if writer then
    return redis.call('ZRANGE', q.queue, 0, 0)[1] == field
  end
  local first = redis.call('ZRANGE', q.writers, 0, 0, 'WITHSCORES')
  return first[1] == nil or tonumber(first[2]) > tonumber(seq)
end

-- Queues `field` at the tail unless it is queued already (`seq`, its arrival number as the
-- caller read it, false when not queued), and marks it alive for a window. Returns its place in
-- the queue (1 = first) when it joined now, else 0, and its arrival number.
--
-- TTLs: the keys must outlive the newest mark by a window (so a queue whose waiters all died
-- expires by itself, and never before; clients may use different windows, so a TTL is only
-- ever raised). The four keys share one expiry: when q.live's TTL is below two windows, all
-- four are set to four windows (raising them all), so the marks of the next window find it
-- long enough and pay one PTTL, not a PTTL and a PEXPIRE per key. A key this call creates has
-- no TTL yet and takes q.live's: q.queue when `joined` is 1, q.seq when it counted 1, and
-- q.writers on its first writer (the one key a queue can gain later).
local function rw_join(q, field, writer, now, window, seq)
  local joined = 0
  local new_writers = false
  if not seq then
    seq = redis.call('INCR', q.seq)
    redis.call('ZADD', q.queue, seq, field)
    if writer then
      redis.call('ZADD', q.writers, seq, field)
      new_writers = redis.call('PTTL', q.writers) == -1
    end
    joined = redis.call('ZCARD', q.queue)
  end
  redis.call('ZADD', q.live, now + window, field)
  local ttl = redis.call('PTTL', q.live)
  if ttl < 2 * window then
    for _, key in ipairs({q.queue, q.writers, q.live, q.seq}) do
      redis.call('PEXPIRE', key, 4 * window)
    end
  else
    if joined == 1 then
      redis.call('PEXPIRE', q.queue, ttl)
    end
    if seq == 1 then
      redis.call('PEXPIRE', q.seq, ttl)
    end
    if new_writers then
      redis.call('PEXPIRE', q.writers, ttl)
    end
  end
  return joined, seq
end

-- Tells the queue's waiters who may enter now (when anyone is queued): `<head>:<first writer>` on
-- the turns channel, the arrival numbers of the head and of the first queued writer (0: none). A
-- waiting client compares them with its waiters' own numbers and wakes only those whose turn
-- came (a queued reader before the first writer, a writer at the head), instead of every waiter
-- on every change.
local function rw_announce(q, publish_cmd, turns)
  local head = redis.call('ZRANGE', q.queue, 0, 0, 'WITHSCORES')
  if head[1] == nil then
    return
  end
  local writer = redis.call('ZRANGE', q.writers, 0, 0, 'WITHSCORES')
  redis.call(publish_cmd, turns, head[2] .. ':' .. (writer[2] or '0'))
end

-- Takes `field` out of the queue. Returns whether it was queued.
local function rw_leave(q, field)
  local was = redis.call('ZREM', q.queue, field) == 1
  redis.call('ZREM', q.writers, field)
  redis.call('ZREM', q.live, field)
  rw_tidy(q)
  return was
end

-- The reply of an attempt that must wait. A writer-preferring wait (`now` set: the queue was
-- looked at) also reports its arrival number and whether its turn has come (the waiting client
-- wakes it on the turns channel only when that changes): {0, joined, hint, 0, seq, may_enter};
-- any other wait {0, joined, hint}.
-- `seq`: the field's arrival number (false when it is not queued).
local function rw_waiting(now, joined, hint, may_enter, seq)
  if not now then
    return {0, joined, hint}
  end
  return {0, joined, hint, 0, tonumber(seq) or 0, may_enter and 1 or 0}
end

-- The writer-preferring queue's gate, for a field that does not hold the lock: drops dead
-- waiters (announcing the new turns), then, unless the field's turn has come, joins it at the
-- tail (`queueing` = 'queue') and answers that it waits. Returns the server time it read, the
-- reply to give at once, or nil when the field may try for the lock, and the field's arrival
-- number (false when it is not queued).
local function rw_gate(q, field, writer, queueing, name, mode, window, publish_cmd, turns)
  local now = rw_now()
  if rw_purge(q, now) > 0 then
    -- Dead waiters may have kept others out: tell who may enter now.
    rw_announce(q, publish_cmd, turns)
  end
  local seq = redis.call('ZSCORE', q.queue, field)
  if rw_turn(q, field, writer, seq) then
    return now, nil, seq
  end
  local joined = 0
  if queueing == 'queue' then
    joined, seq = rw_join(q, field, writer, now, window, seq)
  end
  return now, rw_waiting(now, joined, mode and redis.call('PTTL', name) or -1, false, seq), seq
end

-- The lock's mode, `field`'s hold count and whether `other` (the holder's field on the other
-- side) is in the hash, in one read; or the reply to give at once when `name` is held as
-- another kind of lock (a mutex's owner hash has no `mode`): writing into it would corrupt both
-- (Redisson's script would), so the attempt waits until it is gone, as behind a writer.
local function rw_mode_and_held(name, field, other)
  local got = redis.call('HMGET', name, 'mode', field, other)
  local mode = got[1]
  if mode == false and redis.call('EXISTS', name) == 1 then
    return false, 0, {0, 0, redis.call('PTTL', name)}, false
  end
  return mode, mode and tonumber(got[2]) or 0, nil, got[3] ~= false
end
