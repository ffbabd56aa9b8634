-- Settle an idempotency record we ran: store its response (a completion),
-- or, when no response is given, give the key up so it can be retried (a
-- release).
-- KEYS[1] record (a string, as idempotency_claim.lua describes); ARGV[1] our
-- claim as the claim wrote it ('run:<owner>:<fp>'), ARGV[2] how the record's
-- notice goes: 'PUBLISH <channel>', or 'SPUBLISH <channel>' on a cluster (the
-- channel in the record's hash slot); a completion adds ARGV[3] retention in
-- milliseconds and ARGV[4] the completed record ('done:<owner>:<fp>:<status>:
-- <big>:<headers length>:<headers><body>').
-- A completion returns 1 when the record now holds our response: stored now,
-- or already stored by an earlier try whose reply was lost (the owner is kept
-- in the completed record to tell), or written into an absent record (our
-- lease ran out, or this Redlock node missed the claim: the handler did run,
-- so the response must be kept rather than let the request run again); 0
-- when another request's claim or response is there.
-- A release returns 1 when it deleted our claim, 0 when the record is gone,
-- completed or not ours.
-- Either is announced (payload '') when a duplicate marked the record as
-- waited on, so that it replays the response or claims the key at once;
-- nobody listens otherwise.
local v = redis.call('GET', KEYS[1])
local storing = ARGV[4] ~= nil
-- Our claim as written, nobody waiting on it: the common case, told by one
-- comparison, before any string is built (each costs the server).
local ours = v == ARGV[1]
local waited = false
if v and not ours then
  -- ':<owner>:<fp>', behind the state's name.
  local tail = string.sub(ARGV[1], 4)
  if storing and string.sub(v, 1, #tail + 5) == 'done' .. tail .. ':' then
    return 1
  end
  waited = v == 'waited' .. tail
  ours = waited
end
if ours or (storing and not v) then
  if storing then
    redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
  else
    redis.call('DEL', KEYS[1])
  end
  if waited then
    -- pcall: a notice refused by an ACL must not undo the step; waiters
    -- then wake at their lease timers instead.
    local space = string.find(ARGV[2], ' ', 1, true)
    redis.pcall(string.sub(ARGV[2], 1, space - 1), string.sub(ARGV[2], space + 1), '')
  end
  return 1
end
return 0
