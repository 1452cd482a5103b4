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

-- Whether `field` may try the lock now (see the invariant above).
local function rw_turn(q, field, writer)
  local seq = redis.call('ZSCORE', q.queue, field)
  if not seq then
    return redis.call('EXISTS', q.queue) == 0
  end
  if writer then
    return redis.call('ZRANGE', q.queue, 0, 0)[1] == field
  end
  local first = redis.call('ZRANGE', q.writers, 0, 0, 'WITHSCORES')
  return first[1] == nil or tonumber(first[2]) > tonumber(seq)
end

-- Queues `field` at the tail unless it is queued already, and marks it alive for a window.
-- Returns its place in the queue (1 = first) when it joined now, else 0.
local function rw_join(q, field, writer, now, window)
  local joined = 0
  if not redis.call('ZSCORE', q.queue, field) then
    local seq = redis.call('INCR', q.seq)
    redis.call('ZADD', q.queue, seq, field)
    if writer then
      redis.call('ZADD', q.writers, seq, field)
    end
    joined = redis.call('ZCARD', q.queue)
  end
  redis.call('ZADD', q.live, now + window, field)
  for _, key in ipairs({q.queue, q.writers, q.live, q.seq}) do
    if redis.call('PTTL', key) < 2 * window then
      redis.call('PEXPIRE', key, 2 * window)
    end
  end
  return joined
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
