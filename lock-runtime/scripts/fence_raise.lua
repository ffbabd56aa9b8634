-- Raise a fencing counter to at least a value (Redlock: after a quorum
-- acquired, every node of that quorum learns the highest token issued, so any
-- later quorum, which shares a node with this one, issues a higher one).
-- KEYS[1] fencing counter (of the key's hash slot); ARGV[1] the token issued
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
