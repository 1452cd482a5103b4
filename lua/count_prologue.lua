-- Shared by the scripts that answer with a count or publish one (the semaphores and the latch)
-- or hand out fencing tokens (every lock script that grants); joined in front of each at compile
-- time by src/scripts.rs, never pasted. Local helpers only.
--
-- Lua numbers are doubles: a count that passes through one (the reply of INCRBY or DECR inside
-- a script, or `tonumber` of a GET) is rounded once it is beyond 2^53, and one near 2^63 comes
-- back as i64::MIN when the script returns it. Counts are answered and published exactly: as
-- the number while that is exact, otherwise as the text of the key that holds the count (Redis
-- stores and prints its integers exactly).
local EXACT_BELOW = 9007199254740992 -- 2^53

-- `n`, a count just read or written through a Lua number, exactly: `n` itself, or the text of
-- `key` (which holds the count) when `n` may have been rounded. Any count whose magnitude is
-- below 2^53 is a double without rounding, and a larger one never rounds to below 2^53.
local function exact_count(n, key)
  if n >= EXACT_BELOW or n <= -EXACT_BELOW then
    return redis.call('GET', key)
  end
  return n
end

-- A count read with GET (`text`, false when the key does not exist), exactly: the text itself
-- when it is an integer as Redis writes one, 0 when there is none; any other text as Lua reads
-- it (or 0).
local function count_of(text)
  if not text then
    return 0
  end
  if string.match(text, '^-?%d+$') then
    return text
  end
  return tonumber(text) or 0
end

-- The fencing counter `key` after one more grant (INCR), exactly: tokens must never repeat, and
-- two counts beyond 2^53 can round to the same number.
local function next_token(key)
  return exact_count(redis.call('INCR', key), key)
end

-- A count from the helpers above as text for a message, exactly (Lua's `..` prints a number with
-- 14 significant digits, so 10^14 and above would arrive in exponent form).
local function count_text(n)
  if type(n) == 'string' then
    return n
  end
  return string.format('%d', n)
end
