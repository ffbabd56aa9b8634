-- Re-arm the lease of an in-flight idempotency record we own.
-- KEYS[1] record; ARGV[1] owner token, ARGV[2] lease in milliseconds
-- Returns 1 when re-armed, 0 when the record is gone, completed or not ours.
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] == 'run' and r[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
