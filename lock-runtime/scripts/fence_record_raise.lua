-- Raise a fenced-write record (fence::redis) to at least a token, as an
-- operator's force-release does: the evicted holder's next fenced write to
-- the resource is refused, and a later holder's (a higher token) passes.
-- KEYS[1] the resource's record; ARGV[1] the token (decimal, no leading
-- zeros); ARGV[2] the record's retention (ms)
-- Returns the record's value afterwards.
local highest = redis.call('GET', KEYS[1])
local token = ARGV[1]
-- Compared as decimal strings, as fence.lua does (exact past 2^53).
if highest and (#highest > #token or (#highest == #token and highest >= token)) then
  return highest
end
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
