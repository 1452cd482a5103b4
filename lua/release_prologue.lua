-- Shared prologue of every release script (the mutexes' and both sides of the read-write lock;
-- joined in front of each at compile time by src/scripts.rs, never pasted). It reads the
-- arguments every release takes and defines local helpers; it touches no key by itself.
--
-- ARGV[1] owner field, ARGV[2] the hold count the caller believes Redis has for the field,
-- ARGV[3] how many holds to release, ARGV[4] '1' when an attempt of the caller may have added one
-- hold it never saw (its reply was lost): that hold is released too when it is there,
-- ARGV[5] the TTL (ms) the remaining holds need, -1 to leave the TTL as it is,
-- ARGV[6] publish command, ARGV[7] the lock's release channel (a fair lock's channel prefix).
local field, expected, dark = ARGV[1], tonumber(ARGV[2]), ARGV[4] == '1'
local remaining_ttl, publish_cmd, channel = tonumber(ARGV[5]), ARGV[6], ARGV[7]
--
-- The compare-and-set every release makes instead of Redisson's unlock latch (PROTOCOL 7): the
-- caller sends the hold count it believes Redis has for its field and how many holds to release;
-- a release sent twice (a resend after a lost reply) finds the count already lowered and changes
-- nothing. `dark`: an attempt of the caller may have added one hold it never saw (its reply was
-- lost); that hold is released too when it is there.
--
-- Returns what the field holds and how many holds to release, or the reply to give at once:
--   held, by, nil          the count matched (or is one above, with `dark`): release `by`
--   0, by, {2, 0}          the lock no longer exists
--   0, by, {-1, 0}         somebody else holds it (our field is not in it)
--   held, by, {3, held}    our count is not what the caller believes: nothing was changed
local function compare_release(name)
  local by = tonumber(ARGV[3])
  local held = tonumber(redis.call('HGET', name, field)) or 0
  if held == 0 then
    if redis.call('EXISTS', name) == 0 then
      return 0, by, {2, 0}
    end
    return 0, by, {-1, 0}
  end
  if held ~= expected then
    if dark and held == expected + 1 then
      return held, by + 1, nil
    end
    return held, by, {3, held}
  end
  return held, by, nil
end

-- Sets `name`'s TTL to what the holds left need (`ttl` ms; nothing when not above 0). Returns
-- whether that cut the TTL by more than half: waiters sleep until the TTL their last attempt saw,
-- and an expiry announces nothing, so the caller then tells them to look again.
local function set_remaining_ttl(name, ttl)
  if ttl <= 0 then
    return false
  end
  local before = redis.call('PTTL', name)
  redis.call('PEXPIRE', name, ttl)
  return before > 2 * ttl
end

-- Raises `name`'s TTL to `ttl` ms when it is shorter (never shortens it: other holders of a
-- read-write lock's hash may need more).
local function raise_ttl(name, ttl)
  if ttl > 0 and redis.call('PTTL', name) < ttl then
    redis.call('PEXPIRE', name, ttl)
  end
end
