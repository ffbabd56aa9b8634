-- Mint the fencing token of a lock we hold, on first use.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (one slot)
-- ARGV[1] owner token
-- Returns the token (> 0): strictly greater than every token issued before
-- for any key of the slot, so tokens rise in the order holders held the
-- key. 0 when the lock is not ours: absent, another owner's, or marked
-- with a deadline that has passed (our lease ended; the key is only pinned
-- for the line: see acquire.lua). A holder whose lease ended never gets a
-- token. A lost reply is safe to ask again: the second token is higher,
-- and minted while ours as well.
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] then
  if not owner or string.sub(owner, 1, #ARGV[1] + 1) ~= ARGV[1] .. '+' then
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
return redis.call('INCR', KEYS[2])
