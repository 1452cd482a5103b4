-- Shared prologue of the expirable semaphore's scripts (joined in front of each at compile time
-- by src/scripts.rs, never pasted). It only defines local helpers; it touches no key by itself.

-- Current time in Unix epoch milliseconds from the server clock: expiries are decided on it.
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua's unpack fails near 8,000 values ("too many results to unpack"), and a guard may hold up to
-- 65,536 permits: a list of members of any length is removed in chunks of this many.
local CHUNK = 1000

-- ZREM of `members[first..]` from `key`, in chunks; how many were there.
local function zrem_all(key, members, first)
  local removed = 0
  for from = first, #members, CHUNK do
    removed = removed + redis.call('ZREM', key, unpack(members, from, math.min(from + CHUNK - 1, #members)))
  end
  return removed
end
