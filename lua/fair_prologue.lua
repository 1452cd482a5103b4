-- Shared prologue of every fair-lock script (joined in front of each script at compile time by
-- src/scripts.rs, never pasted). It only defines local helpers; it touches no key by itself.
--
-- Invariant kept by every fair script: the queue list and the deadline zset hold the same members,
-- and only the queue head may take the lock.

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

-- Remove waiters at the head of the queue whose deadline has passed. Only the head is examined, as
-- RFairLock does, so the cost is proportional to the number of dead waiters removed, not to the queue
-- length. A head that has no deadline at all cannot belong to a live waiter of either client (both
-- always write the two together) and would block the queue for ever, so it is treated as expired.
-- Returns the number of waiters removed and the live head left (nil when the queue is empty).
local function purge_stale_head(queue, deadlines)
  local removed = 0
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return removed, nil
    end
    local score = redis.call('ZSCORE', deadlines, head)
    if score and tonumber(score) > server_now_ms() then
      return removed, head
    end
    redis.call('ZREM', deadlines, head)
    redis.call('LPOP', queue)
    removed = removed + 1
  end
end

-- Tell a waiter that the lock is free: PROTOCOL 2 payload '0' on its own channel (release channel
-- .. ':' .. owner field).
local function tell(publish_cmd, channel_prefix, waiter)
  redis.call(publish_cmd, channel_prefix .. ':' .. waiter, '0')
end

-- The lock is known to be free: drop dead heads, then tell the live head, if any. `except` (may be
-- nil) is a field that must not be told, because it is the caller itself.
local function wake_head(queue, deadlines, publish_cmd, channel_prefix, except)
  local _, head = purge_stale_head(queue, deadlines)
  if head and head ~= except then
    tell(publish_cmd, channel_prefix, head)
  end
end
