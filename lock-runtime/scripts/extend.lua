-- Extend a lease we hold.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] lease in milliseconds
-- KEYS[2] (a leader election's): the leader's record, re-armed with the lease.
-- Returns 1 when re-armed, 0 when the key is absent, held by another owner,
-- or marked with a deadline that has passed (our lease ended; the key is
-- only pinned for the line: see acquire.lua).
-- A marked value gets the new deadline, and the key keeps its pin: its
-- expiry only moves later (the line may wait past our lease), except that
-- it never ends before our new deadline.
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] then
  if not owner or string.sub(owner, 1, #ARGV[1] + 1) ~= ARGV[1] .. '+' then
    return 0
  end
  local ends = tonumber(string.sub(owner, #ARGV[1] + 2))
  if ends then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if ends <= now then
      return 0
    end
    local lease = tonumber(ARGV[2])
    local keep = math.max(redis.call('PTTL', KEYS[1]), lease)
    redis.call('SET', KEYS[1], ARGV[1] .. '+' .. (now + lease), 'PX', keep)
    if KEYS[2] then
      redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
    return 1
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if KEYS[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
