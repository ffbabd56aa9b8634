-- A fenced write: the commands run only if the token is at least the highest
-- recorded for the resource, which then becomes the token; one atomic step.
-- The commands are data: this script runs whatever names it is given, and the
-- client sends only names from its allow-list (lock-runtime/src/fence/commands.rs).
--
-- KEYS[1]: the resource's record; KEYS[2..]: the commands' keys, in order of use.
-- ARGV[1]: the token (decimal, no leading zeros); ARGV[2]: the record's
-- retention (ms); ARGV[3]: the number of commands; then, per command: its
-- name, its shape (one letter per argument after the name: K takes the next
-- of KEYS, V the next of ARGV), its values.
-- Returns {1, replies} when the commands ran (one reply each), {0, highest}
-- when the token is stale (nothing was written).
local token = ARGV[1]
local highest = redis.call('GET', KEYS[1])
-- Compared as decimal strings (length, then digits): exact past 2^53, where
-- Lua's numbers are not.
if highest and (#highest > #token or (#highest == #token and highest > token)) then
  return {0, highest}
end
-- The record first: if a command fails half-way (a script is not rolled back),
-- what the ones before it wrote is still covered by a record this high.
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
local replies = {}
local k, a = 2, 4
for c = 1, tonumber(ARGV[3]) do
  local argv = {ARGV[a]}
  local shape = ARGV[a + 1]
  a = a + 2
  for i = 1, #shape do
    if string.byte(shape, i) == 75 then -- 'K'
      argv[#argv + 1] = KEYS[k]
      k = k + 1
    else
      argv[#argv + 1] = ARGV[a]
      a = a + 1
    end
  end
  replies[c] = redis.call(unpack(argv))
end
return {1, replies}
