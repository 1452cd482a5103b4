-- Baseline for benches/contended.rs: the polling lock's release. Deletes the lock key only while
-- it still holds the caller's token, so a late release never frees someone else's lock.
-- KEYS[1] lock key; ARGV[1] the caller's token. Reply: 1 deleted, 0 not ours.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
