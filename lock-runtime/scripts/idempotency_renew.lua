-- Re-arm the lease of an in-flight idempotency record we own.
-- KEYS[1] record; ARGV[1] owner token, ARGV[2] lease in milliseconds
-- Returns 1 when re-armed, or when the record already holds our completed
-- response (a renewal that crossed the completion: nothing to re-arm, and
-- the retention must not shrink to a lease); 0 when the record is gone or
-- another request's.
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == 'run' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
