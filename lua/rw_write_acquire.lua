-- Read-write lock, write side: one acquire attempt (RReadWriteLock layout, PROTOCOL 10), a
-- compare-and-set on our hold count, so sending the same attempt twice never adds a second hold.
--
-- KEYS[1] the lock hash NAME, KEYS[2] fencing counter, KEYS[3..6] the writer-preferring queue:
-- arrival queue, writers, liveness marks, counter (rw_prologue.lua)
-- ARGV[1] lease in ms (the TTL is never shortened below it), ARGV[2] our write field
-- '<client uuid>:<holder id>:write', ARGV[3] the hold count the caller believes Redis has for it,
-- ARGV[4] '1' to increment the fencing counter on a grant, ARGV[5] our read field (the holder's
-- field without ':write'), ARGV[6] '' for a handle that does not prefer writers, else 'try' or
-- 'queue' (as in rw_read_acquire.lua), ARGV[7] the liveness window in ms, ARGV[8] publish
-- command, ARGV[9] the lock's channel, ARGV[10] the turns channel of the writer-preferring queue
--
-- Reply: {1, count, token} taken or re-entered; {2, count, token} the caller's count + 1 was
--        already there (taken up, not added); {0, pos, pttl} held by others (pos: our place in
--        the writer-preferring queue when this attempt joined it, else 0) (pttl: their remaining
--        TTL, -1 no expiry or free: wait for a message or a heartbeat; also when a
--        writer-preferring queue has us wait); {-2, 0, 0} refused: we hold it for reading only,
--        and a writer would wait for ever behind our own read holds (Redisson's upgrade
--        self-deadlock).
--        A hold taken up gets a new token (when fenced) all the same: it may be one an ended
--        call of this holder left behind, whose guard was handed its grant's token.

local name, token_key = KEYS[1], KEYS[2]
local q = {queue = KEYS[3], writers = KEYS[4], live = KEYS[5], seq = KEYS[6]}
local lease, field, expected = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local fenced, read_field = ARGV[4] == '1', ARGV[5]
local queueing, window, publish_cmd, turns = ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[10]

local function token()
  if fenced then
    return next_token(token_key)
  end
  return 0
end

local function extend()
  if redis.call('PTTL', name) < lease then
    redis.call('PEXPIRE', name, lease)
  end
end

local mode, held, other_kind, reads = rw_mode_and_held(name, field, read_field)
if other_kind then
  return other_kind
end
if held > 0 and held == expected + 1 then
  extend()
  return {2, held, token()}
end
if mode == 'read' and reads then
  return {-2, 0, 0}
end
local now, seq

if queueing ~= '' and held == 0 then
  local wait
  now, wait, seq = rw_gate(q, field, true, queueing, name, mode, window, publish_cmd, turns)
  if wait then
    return wait
  end
end

if mode == false then
  redis.call('HSET', name, 'mode', 'write', field, 1)
  redis.call('PEXPIRE', name, lease)
  if now and rw_leave(q, field) then
    rw_announce(q, publish_cmd, turns)
  end
  return {1, 1, token()}
end
if mode == 'write' and held > 0 then
  local count = redis.call('HINCRBY', name, field, 1)
  extend()
  return {1, count, token()}
end
local joined = 0
if queueing == 'queue' and now then
  joined, seq = rw_join(q, field, true, now, window, seq)
end
return rw_waiting(now, joined, redis.call('PTTL', name), true, seq)
