-- Extend many leases in one call (the batched watchdog).
-- KEYS[i] lock key; ARGV[2i-1] owner token, ARGV[2i] lease in milliseconds
-- Returns a list: 1 where re-armed, 0 where absent or held by another owner.
-- (A value may carry a '+': somebody queued; see acquire.lua.)
local out = {}
for i = 1, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  local token = ARGV[2 * i - 1]
  if owner == token or owner == token .. '+' then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
