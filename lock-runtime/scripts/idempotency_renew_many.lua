-- Re-arm the leases of in-flight idempotency records we own (the batched
-- watchdog; on a cluster every key of one call is in one hash slot).
-- KEYS[i] record; ARGV[2i-1] owner token, ARGV[2i] lease in milliseconds
-- Returns a list: 1 where re-armed, or where the record already holds our
-- completed response (a renewal that crossed the completion: nothing to
-- re-arm, and the retention must not shrink to a lease); 0 where the record
-- is gone or another request's.
local out = {}
for i = 1, #KEYS do
  local r = redis.call('HMGET', KEYS[i], 'state', 'owner')
  if r[2] ~= ARGV[2 * i - 1] then
    out[i] = 0
  else
    if r[1] == 'run' then
      redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    end
    out[i] = 1
  end
end
return out
