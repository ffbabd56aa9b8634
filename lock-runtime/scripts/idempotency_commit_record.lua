-- The work's writes and its completed idempotency record, one atomic step on
-- the lock server itself: the record is its own committed copy
-- (`commit_on_lock_server`), so no copy is written, none is looked for, and
-- no completion follows.
-- KEYS[1] the record (a string, as idempotency_claim.lua describes); KEYS[2..]
-- the commands' keys.
-- ARGV[1] how the record's notice goes ('PUBLISH <channel>'); ARGV[2] the
-- retention in milliseconds; ARGV[3] the completed record ('done:<owner>:<fp>:
-- <status>:<big>:<headers length>:<headers><body>'); ARGV[4] the number of
-- commands; then, per command, as fence.lua takes them (the client sends only
-- names from its allow-list, lock-runtime/src/fence/commands.rs): its name,
-- its shape (K: the next of KEYS, V: the next of ARGV), its values.
-- Returns {1, replies} when the commands ran and the record now holds ours;
-- {0, record} when a completed record was there already (another claimer's
-- work committed first, or ours from a try whose reply was lost): nothing was
-- written; {2} when the key holds no record (set by hand): nothing was
-- written.
-- The record is completed whoever's claim it holds, or none (our lease ran
-- out): the work committed here is the one that happened, and a claimer
-- still running finds it when it commits, as it would find a copy.
local v = redis.call('GET', KEYS[1])
local waited = false
if v then
  local state = string.match(v, '^(%a+):')
  if state == 'done' then
    return {0, v}
  elseif state == 'waited' then
    waited = true
  elseif state ~= 'run' then
    return {2}
  end
end
local replies = {}
local k, a = 2, 5
for c = 1, tonumber(ARGV[4]) do
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
-- Last: a command that fails (a script is not rolled back) leaves the record
-- in flight, so the claim is released and the retry runs the work again.
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
if waited then
  -- pcall: a notice refused by an ACL must not undo the step; waiters then
  -- wake at their lease timers instead.
  local space = string.find(ARGV[1], ' ', 1, true)
  redis.pcall(string.sub(ARGV[1], 1, space - 1), string.sub(ARGV[1], space + 1), '')
end
return {1, replies}
