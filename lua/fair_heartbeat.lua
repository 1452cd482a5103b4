-- Fair lock: batched liveness heartbeat for waiters of one client (PROTOCOL 7: live waiters are never
-- purged, dead ones are purged after a short window).
--
-- For entry i (i = 1..n): KEYS[3i-2] owner hash NAME, KEYS[3i-1] waiter queue, KEYS[3i] deadline zset
-- ARGV[1] liveness window in ms, ARGV[2] publish command
-- ARGV[2i+1] owner field of waiter i, ARGV[2i+2] release channel of its lock
--
-- Reply: one code per entry: 0 queued and nothing to do, 1 the waiter is the head of a free lock (its
-- client wakes it: a lost or never-sent message costs at most one heartbeat period), 2 the waiter is
-- no longer queued (its client wakes it, and its next attempt puts it back), 3 the waiter is second
-- in line (its client wakes it once so its next attempt learns the head's deadline to watch).
--
-- Each entry also purges its queue's dead head and wakes the new head of a free lock, so a waiter
-- whose process died is removed within the liveness window even when nobody else runs a script.

local liveness, publish_cmd = tonumber(ARGV[1]), ARGV[2]
local replies = {}

for i = 1, #KEYS / 3 do
  local name, queue, deadlines = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local field, channel_prefix = ARGV[2 * i + 1], ARGV[2 * i + 2]
  local purged, head = purge_stale_head(queue, deadlines)
  if purged > 0 and head and head ~= field and redis.call('EXISTS', name) == 0 then
    tell(publish_cmd, channel_prefix, head)
  end
  if redis.call('ZADD', deadlines, 'XX', 'CH', server_now_ms() + liveness, field) == 0
      and not redis.call('ZSCORE', deadlines, field) then
    replies[i] = 2
  elseif redis.call('EXISTS', name) == 0 and head == field then
    replies[i] = 1
  elseif redis.call('LINDEX', queue, 1) == field then
    replies[i] = 3
  else
    replies[i] = 0
  end
end
return replies
