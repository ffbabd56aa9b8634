-- Store the response of an in-flight idempotency record we own.
-- KEYS[1] record; ARGV[1] owner token, ARGV[2] retention in milliseconds,
-- ARGV[3] status, ARGV[4] headers (encoded), ARGV[5] body
-- Returns 1 when stored, 0 when the record is gone, completed or not ours
-- (its lease ran out and another request may have claimed it).
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] == 'run' and r[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5])
  redis.call('HDEL', KEYS[1], 'owner')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
