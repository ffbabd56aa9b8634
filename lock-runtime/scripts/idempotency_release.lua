-- Give up an in-flight idempotency record we own, so the key can be retried.
-- KEYS[1] record; ARGV[1] owner token
-- Returns 1 when deleted, 0 when the record is gone, completed or not ours.
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] == 'run' and r[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
