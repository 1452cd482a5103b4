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

-- Reclaims up to `limit` permits of `expiries` whose expiry passed by `now` (as Redisson does,
-- lazily): they come back to the count `name`, and a positive new count is published on
-- `channel`.
local function reclaim_expired(name, expiries, now, limit, publish_cmd, channel)
  local expired = redis.call('ZRANGEBYSCORE', expiries, 0, now, 'LIMIT', 0, limit)
  if #expired > 0 then
    zrem_all(expiries, expired, 1)
    local value = redis.call('INCRBY', name, #expired)
    if value > 0 then
      redis.call(publish_cmd, channel, exact_count(value, name))
    end
  end
end

-- The available count in `name` (0 when missing), or the error reply when it is not a number.
local function available_count(name)
  local available = tonumber(redis.call('GET', name) or '0')
  if available == nil then
    return nil, redis.error_reply('ERR fairlock: semaphore ' .. name .. ' does not hold a number')
  end
  return available, nil
end
