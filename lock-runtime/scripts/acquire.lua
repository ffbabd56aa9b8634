-- Acquire a lock.
-- KEYS[1] lock key, KEYS[2] fencing counter (same hash slot)
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] lease in milliseconds
-- Returns {1, fencing_token} when acquired (or re-entered by the same token),
--         {0, remaining_lease_ms} when held by another owner.
local owner = redis.call('GET', KEYS[1])
if not owner then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, fence}
end
if owner == ARGV[1] then
  -- Our own earlier attempt whose reply was lost: keep it, re-arm the lease.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return {0, ttl}
