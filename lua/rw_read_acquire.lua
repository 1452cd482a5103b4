-- Read-write lock, read side: one acquire attempt (RReadWriteLock layout, PROTOCOL 10), a
-- compare-and-set on our hold count, so sending the same attempt twice never adds a second hold.
--
-- KEYS[1] the lock hash NAME (field `mode` = 'read' | 'write', plus one field per holder)
-- KEYS[2] the base the lease keys are named from: `{NAME}`, or NAME when it has a hash tag
-- KEYS[3..6] the writer-preferring queue: arrival queue, writers, liveness marks, counter
-- (rw_prologue.lua)
-- ARGV[1] lease in ms, ARGV[2] our read field '<client uuid>:<holder id>', ARGV[3] the hold count
-- the caller believes Redis has for it, ARGV[4] our write field (the same plus ':write'),
-- ARGV[5] '' for a handle that does not prefer writers (the queue is not looked at), else 'try'
-- (never queue) or 'queue' (queue, or stay queued, when we may not enter yet), ARGV[6] the
-- liveness window in ms, ARGV[7] publish command, ARGV[8] the lock's channel, ARGV[9] the
-- turns channel of the writer-preferring queue
--
-- Every read hold numbered k has a lease key `<base>:<field>:rwlock_timeout:<k>` (a string with a
-- PX), as Redisson's readers do: a Redisson read unlock counts a reader as alive only through its
-- lease keys. Invariant kept here and by the renewal: each of our lease keys of a field lives at
-- least as long as the longest need of any of the field's holds, so releasing the top-numbered
-- hold (whatever lease it had) never leaves the others short.
--
-- Reply: {1, count, 0} taken or re-entered; {2, count, 0} the caller's count + 1 was already there
--        (an earlier send of this attempt took it; taken up, not added); {0, pos, pttl} a writer
--        holds the lock, or a writer-preferring queue has us wait behind a writer; pos = our place
--        in that queue when this attempt joined it, else 0; pttl = the lock's remaining TTL (-1:
--        no expiry, or free: wait for a message or a heartbeat); a writer-preferring wait adds
--        {…, 0, seq, may_enter}: our arrival number and whether our turn has come (see
--        rw_announce in rw_prologue.lua).

local name, base = KEYS[1], KEYS[2]
local q = {queue = KEYS[3], writers = KEYS[4], live = KEYS[5], seq = KEYS[6]}
local lease, field, expected, write_field = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
local queueing, window, publish_cmd, turns = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[9]
local prefix = base .. ':' .. field .. ':rwlock_timeout:'

-- Every lease key of ours (1..count) lives at least `lease` from now; the hash too.
local function cover(count)
  for k = 1, count do
    local key = prefix .. k
    local left = redis.call('PTTL', key)
    if left == -2 then
      redis.call('SET', key, 1, 'PX', lease)
    elseif left < lease then
      redis.call('PEXPIRE', key, lease)
    end
  end
  if redis.call('PTTL', name) < lease then
    redis.call('PEXPIRE', name, lease)
  end
end

local mode, held, other_kind, writes = rw_mode_and_held(name, field, write_field)
if other_kind then
  return other_kind
end
local own_writer = mode == 'write' and writes
local now, seq

if queueing ~= '' and held == 0 and not own_writer then
  local wait
  now, wait, seq = rw_gate(q, field, false, queueing, name, mode, window, publish_cmd, turns)
  if wait then
    return wait
  end
end

local function entered(code, count)
  if now and rw_leave(q, field) then
    rw_announce(q, publish_cmd, turns)
  end
  return {code, count, 0}
end

if mode == false then
  redis.call('HSET', name, 'mode', 'read', field, 1)
  redis.call('SET', prefix .. 1, 1, 'PX', lease)
  redis.call('PEXPIRE', name, lease)
  return entered(1, 1)
end
if held > 0 and held == expected + 1 then
  cover(held)
  return {2, held, 0}
end
if mode == 'read' or own_writer then
  local count = redis.call('HINCRBY', name, field, 1)
  cover(count)
  return entered(1, count)
end
local joined = 0
if queueing == 'queue' and now then
  joined, seq = rw_join(q, field, false, now, window, seq)
end
return rw_waiting(now, joined, redis.call('PTTL', name), true, seq)
