-- Shared prologue of the test peer's fair-lock scripts (joined in front of each at compile time by
-- tests/support/redisson_peer.rs). The peer plays a Java client using Redisson's RFairLock, so it
-- follows PROTOCOL 4 to the letter, quirks included, with the CALLER's clock (`now`, epoch ms).

-- Waiters whose deadline has passed leave from the front of the queue. Only the front is looked at,
-- and a front entry that has no deadline at all is NOT removed (Redisson keeps it, and it blocks).
local function drop_expired_front(queue, deadlines, now)
  while true do
    local front = redis.call('LINDEX', queue, 0)
    if not front then
      return
    end
    local score = redis.call('ZSCORE', deadlines, front)
    if not score or tonumber(score) > now then
      return
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, front)
  end
end
