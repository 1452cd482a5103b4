-- Read-write lock: batched liveness heartbeat of one client's writer-preferring waiters
-- (PROTOCOL 10: live waiters keep their place however long they wait, dead ones are purged
-- within a window).
--
-- For entry i (i = 1..n): KEYS[5i-4] the lock hash NAME, KEYS[5i-3..5i] its writer-preferring
-- queue: arrival queue, writers, liveness marks, counter (rw_prologue.lua)
-- ARGV[1] liveness window in ms, ARGV[2] publish command; ARGV[2i + 1] the owner field of waiter
-- i, ARGV[2i + 2] the turns channel of its queue
--
-- Each entry first drops the queue's dead waiters (and announces the new turns when it did).
--
-- Reply: one code per entry: 0 queued, nothing to do; 1 the waiter may enter now by the queue's
-- rule and nobody holds the lock against it (its client wakes it: a lost message costs at most
-- one heartbeat period); 2 the waiter is not queued (its client wakes it; its next attempt
-- queues it again). An entry whose keys cannot be read reports 2 (its own next attempt meets the
-- error) and never fails the other entries.

local window, publish_cmd = tonumber(ARGV[1]), ARGV[2]
local now = rw_now()
local replies = {}

local function beat(name, q, field, turns)
  if rw_purge(q, now) > 0 then
    rw_announce(q, publish_cmd, turns)
  end
  local seq = redis.call('ZSCORE', q.queue, field)
  if not seq then
    rw_tidy(q)
    return 2
  end
  local writer = string.sub(field, -6) == ':write'
  rw_join(q, field, writer, now, window, seq)
  if rw_turn(q, field, writer, seq) then
    local mode = redis.call('HGET', name, 'mode')
    if mode == false or (not writer and mode == 'read') then
      return 1
    end
  end
  return 0
end

for i = 1, #KEYS / 5 do
  local q = {queue = KEYS[5 * i - 3], writers = KEYS[5 * i - 2], live = KEYS[5 * i - 1],
    seq = KEYS[5 * i]}
  local ok, code = pcall(beat, KEYS[5 * i - 4], q, ARGV[2 * i + 1], ARGV[2 * i + 2])
  replies[i] = ok and code or 2
end
return replies
