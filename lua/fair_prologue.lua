-- Shared prologue of every fair-lock script (joined in front of each script at compile time by
-- src/scripts.rs, never pasted). It only defines local helpers; it touches no key by itself.
--
-- Invariant kept by every fair script: the queue list and the deadline zset hold the same members,
-- and only the queue head may take the lock.

-- Current time in Unix epoch milliseconds from the server clock (PROTOCOL 7: fairlock clients never
-- pass their own clock, so they never disagree about deadlines).
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Remove waiters at the head of the queue whose deadline has passed. Only the head is examined, as
-- RFairLock does, so the cost is proportional to the number of dead waiters removed, not to the queue
-- length. A head that has no deadline at all cannot belong to a live waiter of either client (both
-- always write the two together) and would block the queue for ever, so it is treated as expired.
-- Returns the number of waiters removed.
local function purge_stale_head(queue, deadlines, now)
  local removed = 0
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      break
    end
    local score = redis.call('ZSCORE', deadlines, head)
    if score and tonumber(score) > now then
      break
    end
    redis.call('ZREM', deadlines, head)
    redis.call('LPOP', queue)
    removed = removed + 1
  end
  return removed
end

-- Tell the queue head that the lock is free: PROTOCOL 2 payload '0' on the head's own channel
-- (release channel .. ':' .. owner field). Does nothing when the lock is held or nobody waits.
-- `except` (may be nil) is a field that must not be woken, because it is the caller itself.
local function wake_head_if_free(name, queue, publish_cmd, channel_prefix, except)
  if redis.call('EXISTS', name) == 1 then
    return
  end
  local head = redis.call('LINDEX', queue, 0)
  if head and head ~= except then
    redis.call(publish_cmd, channel_prefix .. ':' .. head, '0')
  end
end
