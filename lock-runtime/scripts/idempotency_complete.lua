-- Store the response of an idempotency record we ran.
-- KEYS[1] record (a string, as idempotency_claim.lua describes); ARGV[1]
-- owner token, ARGV[2] retention in milliseconds, ARGV[3] the completed
-- record ('done:<owner>:<fp>:<status>:<big>:<headers length>:<headers><body>'),
-- ARGV[4] the record's notice channel (in the record's hash slot), ARGV[5]
-- 'PUBLISH', or 'SPUBLISH' on a cluster
-- Returns 1 when the record now holds our response: stored now, or already
-- stored by an earlier try whose reply was lost (the owner is kept in the
-- completed record to tell), or written into an absent record (our lease ran
-- out, or this Redlock node missed the claim: the handler did run, so the
-- response must be kept rather than let the request run again).
-- Returns 0 when another request's claim or response is there.
-- A new completion is announced (payload '') when a duplicate marked the
-- record as waited on, so that it replays it at once; nobody listens
-- otherwise.
local v = redis.call('GET', KEYS[1])
local function is(tag)
  local prefix = tag .. ':' .. ARGV[1] .. ':'
  return v and string.sub(v, 1, #prefix) == prefix
end
if is('done') then
  return 1
end
local waited = is('waited')
if not v or waited or is('run') then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  if waited then
    -- pcall: a notice refused by an ACL must not undo the completion;
    -- waiters then wake at their lease timers instead.
    redis.pcall(ARGV[5], ARGV[4], '')
  end
  return 1
end
return 0
