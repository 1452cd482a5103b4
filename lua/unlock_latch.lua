-- Shared prologue of the unlock scripts (joined in front at compile time): the unlock latch of
-- PROTOCOL 1. An unlock carries a request id; its outcome is remembered under
-- redisson_unlock_latch:{NAME}:<request id> ('0' still held, '1' released) for a while, so a retry
-- of the same request after a timeout returns the first outcome instead of releasing twice.

local function latched_outcome(latch)
  local seen = redis.call('GET', latch)
  if seen then
    return tonumber(seen)
  end
  return nil
end

local function remember_outcome(latch, outcome, latch_ms)
  redis.call('SET', latch, outcome, 'PX', latch_ms)
  return outcome
end
