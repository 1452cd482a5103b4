-- Helpers shared by the operators' scripts, `admin_*.lua` (src/scripts.rs joins this file in
-- front of each of them at compile time; `fairlock::admin` runs them, and so does the `fairlock`
-- command-line tool through it). Defines local functions only.
--
-- Keys of one fair lock (docs/PROTOCOL.md section 1): the owner hash NAME, the waiter queue Q (a
-- list of owner fields), the deadline zset Z (score: a deadline in epoch ms) and fairlock's
-- liveness zset L (score: the time by which a fairlock waiter must show life again).
--
-- How a queued waiter is judged dead, using the server clock. This is the library's rule,
-- `QueuedWaiter::dead_reason` in src/state.rs, which inspection reports with; `dead_reason`
-- below is its one Lua form, because force-unlock and purge-dead must judge and remove in the
-- same atomic step. Change both together, codes included:
-- * it has a mark in L (a fairlock waiter): dead once that mark is not in the future, whatever
--   its score in Z says (Redisson clients shift those scores, PROTOCOL 4 and 7);
-- * it has no mark, but its client id (the field up to its last ':') is the client id of some
--   member of L: dead, since every queued fairlock waiter keeps a mark while it is queued;
-- * otherwise (a Redisson waiter): dead once its score in Z is not in the future, or when it has
--   no score at all.

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The client part of an owner field `<client id>:<holder id>`.
local function client_of(field)
  return string.match(field, '^(.*):[^:]*$') or field
end

-- The set of client ids that are known to be fairlock clients: those with a mark in L.
local function fairlock_clients(liveness)
  local known = {}
  for _, member in ipairs(redis.call('ZRANGE', liveness, 0, -1)) do
    known[client_of(member)] = true
  end
  return known
end

-- Why `field` looks dead at `now` (a stable code, `DeadReason::code` in the library), or nil while
-- it looks alive.
local function dead_reason(deadlines, liveness, known, field, now)
  local mark = redis.call('ZSCORE', liveness, field)
  if mark then
    if tonumber(mark) <= now then
      return 'liveness_lapsed'
    end
    return nil
  end
  if known[client_of(field)] then
    return 'liveness_missing'
  end
  local deadline = redis.call('ZSCORE', deadlines, field)
  if not deadline then
    return 'no_deadline'
  end
  if tonumber(deadline) <= now then
    return 'deadline_passed'
  end
  return nil
end

-- Takes `field` out of Q, Z and L.
local function drop_waiter(queue, deadlines, liveness, grants, field)
  redis.call('LREM', queue, 0, field)
  redis.call('ZREM', deadlines, field)
  redis.call('ZREM', liveness, field)
  -- Its request for a direct hand-off (PROTOCOL 8) goes with it.
  redis.call('HDEL', grants, field)
  -- As the library's scripts do: with nobody queued, the liveness set and the requests have no
  -- live member (their TTL may be minutes, PROTOCOL 7).
  if redis.call('LLEN', queue) == 0 then
    redis.call('DEL', liveness, grants)
  end
end

-- Publishes the release message '0' (PROTOCOL 2) on `channel` with each command in `commands`
-- (PUBLISH and/or SPUBLISH); returns the receivers Redis counted.
local function announce(channel, commands)
  local receivers = 0
  for _, command in ipairs(commands) do
    receivers = receivers + redis.call(command, channel, '0')
  end
  return receivers
end

-- ARGV[2], ARGV[3], ...: the publish commands every admin script receives after the channel.
local function publish_commands()
  local commands = {}
  for i = 2, #ARGV do
    commands[#commands + 1] = ARGV[i]
  end
  return commands
end
