-- Give up an in-flight idempotency record we own, so the key can be retried.
-- KEYS[1] record (a string, as idempotency_claim.lua describes); ARGV[1]
-- owner token, ARGV[2] the record's notice channel (in the record's hash
-- slot), ARGV[3] 'PUBLISH', or 'SPUBLISH' on a cluster
-- Returns 1 when deleted, 0 when the record is gone, completed or not ours.
-- A deletion is announced (payload '': free) when a duplicate marked the
-- record as waited on, so that it claims it at once.
local v = redis.call('GET', KEYS[1])
local function is(tag)
  local prefix = tag .. ':' .. ARGV[1] .. ':'
  return v and string.sub(v, 1, #prefix) == prefix
end
local waited = is('waited')
if waited or is('run') then
  redis.call('DEL', KEYS[1])
  if waited then
    -- pcall: a notice refused by an ACL must not undo the release; waiters
    -- then wake at their lease timers instead.
    redis.pcall(ARGV[3], ARGV[2], '')
  end
  return 1
end
return 0
