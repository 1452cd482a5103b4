-- Fair lock: batched liveness heartbeat for waiters of one client (PROTOCOL 7: live waiters are never
-- purged, dead ones are purged after a short window).
--
-- For entry i (i = 1..n): KEYS[6i-5] owner hash NAME, KEYS[6i-4] waiter queue, KEYS[6i-3] deadline
-- zset, KEYS[6i-2] liveness zset, KEYS[6i-1] grant requests hash, KEYS[6i] fencing counter
-- ARGV[1] liveness window in ms, ARGV[2] publish command, ARGV[3] the longest wait a Redisson
-- client uses (ms); ARGV[2i+2] owner field of waiter i, ARGV[2i+3] release channel of its lock
--
-- Reply: one code per entry: 0 queued and nothing to do, 1 the waiter is the head of a free lock (its
-- client wakes it: a lost or never-sent message costs at most one heartbeat period), 2 the waiter is
-- no longer queued (its client wakes it: its next attempt takes up a hold handed to it whose
-- message was lost, or puts it back in the queue), 3 the waiter is second in line (its client
-- wakes it so its next attempt learns the head's deadline to watch).
-- An entry whose keys cannot be read (a key of the wrong type under the lock's name) reports 2:
-- its waiter's own next attempt meets the error. It never fails the other entries.
--
-- Each entry also purges its queue's dead head and hands a free lock on to the new head (a grant
-- or a wake-up, `pass_on`), so a waiter whose process died is removed within the liveness window
-- even when nobody else runs a script.

local window, publish_cmd, redisson_wait = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local replies = {}

local function beat(k, field, channel_prefix)
  local name, queue, deadlines, liveness = k.name, k.queue, k.deadlines, k.liveness
  local purged, head = purge_stale_head(queue, deadlines, liveness, k.grants)
  if purged > 0 and head and head ~= field and redis.call('EXISTS', name) == 0 then
    if pass_on(k, publish_cmd, channel_prefix) then
      head = redis.call('LINDEX', queue, 0)
    end
  end
  if not redis.call('ZSCORE', deadlines, field) then
    -- Its mark, if any, is its tombstone: left for its next attempt (and the sweep).
    return 2
  end
  local deadline = refreshed_deadline(queue, deadlines, liveness, field, window,
    redisson_wait)
  redis.call('ZADD', deadlines, 'XX', 'GT', deadline, field)
  mark_alive(liveness, k.grants, field, window, deadline)
  sweep_liveness(deadlines, liveness, window)
  if head == field and redis.call('EXISTS', name) == 0 then
    return 1
  end
  if redis.call('LINDEX', queue, 1) == field then
    return 3
  end
  return 0
end

for i = 1, #KEYS / 6 do
  local k = {name = KEYS[6 * i - 5], queue = KEYS[6 * i - 4], deadlines = KEYS[6 * i - 3],
    liveness = KEYS[6 * i - 2], grants = KEYS[6 * i - 1], token = KEYS[6 * i]}
  local ok, code = pcall(beat, k, ARGV[2 * i + 2], ARGV[2 * i + 3])
  replies[i] = ok and code or 2
end
return replies
