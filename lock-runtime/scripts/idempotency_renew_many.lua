-- Re-arm the leases of in-flight idempotency records we own (the batched
-- watchdog; on a cluster every key of one call is in one hash slot).
-- KEYS[i] record (a string, as idempotency_claim.lua describes); ARGV[2i-1]
-- owner token, ARGV[2i] lease in milliseconds
-- Returns a list: 1 where re-armed, or where the record already holds our
-- completed response (a renewal that crossed the completion: nothing to
-- re-arm, and the retention must not shrink to a lease); 0 where the record
-- is gone or another request's.
local function is(v, tag, owner)
  local prefix = tag .. ':' .. owner .. ':'
  return v and string.sub(v, 1, #prefix) == prefix
end
local out = {}
for i = 1, #KEYS do
  local owner = ARGV[2 * i - 1]
  local v = redis.call('GET', KEYS[i])
  if is(v, 'run', owner) or is(v, 'waited', owner) then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  elseif is(v, 'done', owner) then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
