-- Release a lock we hold and tell the waiters.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] release-notice channel
-- Returns 1 when released, 0 when the key is absent or held by another owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
