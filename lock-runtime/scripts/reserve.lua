-- Keep a lock we hold for the next holder in our own process, and reserve
-- fencing tokens for the hand-overs it makes without a round trip.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's slot, KEYS[3] waiter
-- queue (one hash slot)
-- ARGV[1] owner token, ARGV[2] lease in milliseconds, ARGV[3] tokens to reserve
-- Returns the highest reserved token (the block is the ARGV[3] tokens up to
-- it: above every token issued before, below every token issued after), or 0
-- when somebody is queued behind us (the lock goes to the queue by a release
-- instead) or the lock is not ours (our lease ended: see acquire.lua).
-- A mark (see acquire.lua) with nobody left in the queue is taken off.
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] then
  if not owner or string.sub(owner, 1, #ARGV[1] + 1) ~= ARGV[1] .. '+'
    or redis.call('LLEN', KEYS[3]) > 0 then
    return 0
  end
  local ends = tonumber(string.sub(owner, #ARGV[1] + 2))
  if ends then
    local t = redis.call('TIME')
    if ends <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
      return 0
    end
  end
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return redis.call('INCRBY', KEYS[2], ARGV[3])
