-- Extend many leases in one call (the batched watchdog).
-- KEYS[i] lock key; ARGV[2i-1] owner token, ARGV[2i] lease in milliseconds
-- Returns a list: 1 where re-armed, 0 where absent or held by another owner.
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
