-- Store the response of an idempotency record we ran.
-- KEYS[1] record; ARGV[1] owner token, ARGV[2] retention in milliseconds,
-- ARGV[3] status, ARGV[4] headers (encoded), ARGV[5] body, ARGV[6] request
-- fingerprint, ARGV[7] '1' when the body was over the storage limit, else '',
-- ARGV[8] the record's notice channel (in the record's hash slot), ARGV[9]
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
local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waited')
if r[2] == ARGV[1] and r[1] == 'done' then
  return 1
end
if (r[1] == 'run' and r[2] == ARGV[1]) or not r[1] then
  -- Every field of a completed record is written (a run record holds no
  -- other but 'waited', which a completed one ignores): no DEL first.
  redis.call('HSET', KEYS[1], 'state', 'done', 'owner', ARGV[1], 'fp', ARGV[6],
    'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5], 'big', ARGV[7])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if r[3] then
    -- pcall: a notice refused by an ACL must not undo the completion;
    -- waiters then wake at their lease timers instead.
    redis.pcall(ARGV[9], ARGV[8], '')
  end
  return 1
end
return 0
