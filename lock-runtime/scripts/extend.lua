-- Extend a lease we hold.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] lease in milliseconds
-- KEYS[2] (a leader election's): the leader's record, re-armed with the lease.
-- Returns 1 when re-armed, 0 when the key is absent or held by another owner.
-- (The value may carry a '+': somebody queued; see acquire.lua.)
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] or owner == ARGV[1] .. '+' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if KEYS[2] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
