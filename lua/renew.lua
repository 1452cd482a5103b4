-- Watchdog renewal for a batch of held locks, every kind (PROTOCOL 3 renew; read holds of a
-- read-write lock, PROTOCOL 10).
--
-- KEYS[i] owner hash NAME of lock i (all in one cluster slot)
-- ARGV[1] new TTL in ms (the watchdog timeout); for lock i, ARGV[2i] our owner field and
-- ARGV[2i + 1] '' for a mutex or a write hold, or, for a read hold, the base its lease keys are
-- named from (Redisson's `{NAME}`, or NAME when it has a hash tag): a read hold numbered k lives
-- in `<base>:<field>:rwlock_timeout:<k>`, in NAME's slot.
--
-- Reply: one integer per lock: 1 renewed, 0 our field is gone (the lock was lost), and for a read
-- hold 2 + ms: renewed, but the lock's TTL was down to `ms` (under half the new TTL) when we came,
-- that is another client (a Redisson reader with a shorter watchdog timeout) sets it shorter than
-- we do; the client then renews that hold sooner and trusts it only that long. A lock is renewed
-- only while our field is there, so a renewal that crosses our own unlock, or somebody else's
-- acquisition, never extends a lock that is not ours; and no TTL is ever shortened (a hold of
-- ours with a longer fixed lease may need more). A read hold also needs every one of its lease
-- keys: one that expired means the hold stopped counting for everybody else (a Redisson read
-- unlock treats a reader without a live lease key as gone), so it is reported lost, not revived.
-- A key of the wrong type under a lock's name reports 0 for that lock alone: our field cannot be
-- in it, and the other locks are renewed.

local ttl = tonumber(ARGV[1])

local function at_least(key)
  local left = redis.call('PTTL', key)
  if left == -2 then
    return false
  end
  if left < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
  return true
end

local replies = {}
for i = 1, #KEYS do
  local name, field, base = KEYS[i], ARGV[2 * i], ARGV[2 * i + 1]
  local count = redis.pcall('HGET', name, field)
  local alive = type(count) == 'string'
  if alive and base ~= '' then
    local prefix = base .. ':' .. field .. ':rwlock_timeout:'
    for k = 1, tonumber(count) or 0 do
      alive = at_least(prefix .. k) and alive
    end
  end
  if alive then
    local found = base ~= '' and redis.call('PTTL', name) or -1
    at_least(name)
    if found >= 0 and found < ttl / 2 then
      replies[i] = 2 + found
    else
      replies[i] = 1
    end
  else
    replies[i] = 0
  end
end
return replies
