-- Settle an idempotency record we ran: store its response (a completion),
-- or, when no response is given, give the key up so it can be retried (a
-- release).
-- KEYS[1] record (a string, as idempotency_claim.lua describes); ARGV[1]
-- owner token, ARGV[2] the record's notice channel (in the record's hash
-- slot), ARGV[3] 'PUBLISH', or 'SPUBLISH' on a cluster; a completion adds
-- ARGV[4] retention in milliseconds and ARGV[5] the completed record
-- ('done:<owner>:<fp>:<status>:<big>:<headers length>:<headers><body>').
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
local function is(tag)
  local prefix = tag .. ':' .. ARGV[1] .. ':'
  return v and string.sub(v, 1, #prefix) == prefix
end
local storing = ARGV[5] ~= nil
if storing and is('done') then
  return 1
end
local waited = is('waited')
if waited or is('run') or (storing and not v) then
  if storing then
    redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[4])
  else
    redis.call('DEL', KEYS[1])
  end
  if waited then
    -- pcall: a notice refused by an ACL must not undo the step; waiters
    -- then wake at their lease timers instead.
    redis.pcall(ARGV[3], ARGV[2], '')
  end
  return 1
end
return 0
