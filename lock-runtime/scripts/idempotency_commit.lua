-- The work's writes (a handler's, a record guard's) and its completed idempotency record, one atomic step.
-- The commands are data, encoded as fence.lua takes them (the client sends
-- only names from its allow-list, lock-runtime/src/fence/commands.rs).
--
-- KEYS[1]: the committed record (a hash); KEYS[2..]: the commands' keys.
-- ARGV[1]: the request's fingerprint; ARGV[2]: the status; ARGV[3]: the kept
-- headers; ARGV[4]: the body; ARGV[5]: '1' when the body was too large to
-- keep; ARGV[6]: the retention (ms); ARGV[7]: the number of commands; then,
-- per command: its name, its shape (K: the next of KEYS, V: the next of
-- ARGV), its values.
-- Returns {1, replies} when the commands ran and the record was written,
-- {0} when a record was there already (another claimer committed first):
-- nothing was written.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
local replies = {}
local k, a = 2, 8
for c = 1, tonumber(ARGV[7]) do
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
-- Last: a command that fails (a script is not rolled back) leaves no record,
-- so the claim is released and the retry runs the work again.
redis.call('HSET', KEYS[1], 'f', ARGV[1], 's', ARGV[2], 'h', ARGV[3], 'b', ARGV[4], 't', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, replies}
