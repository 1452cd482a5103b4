-- Baseline for benches/watchdog_scale.rs: the renewal one per-lock timer sends for one lock. It
-- extends the lock only while our owner field is still in it.
-- KEYS[1] lock hash; ARGV[1] new TTL (ms), ARGV[2] our owner field. Reply: 1 renewed, 0 gone.

if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 1
end
return 0
