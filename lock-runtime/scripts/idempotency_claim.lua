-- Claim an idempotency record, or report what it holds.
-- KEYS[1] record (a hash: state, owner, fp, status, headers, body, big, and
-- waited once a duplicate waits on it)
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] request fingerprint,
-- ARGV[3] in-flight lease in milliseconds, ARGV[4] '1' when the caller will
-- wait for a record in flight (it marks the record, so that its completion
-- or release is announced), else ''
-- Returns {code, remaining_ms, status, headers, body, big}:
--   code 0: claimed for ARGV[1] (state "run", expires after the lease)
--   code 1: in flight for another owner, for at most remaining_ms
--   code 2: completed: status, headers and body of the stored response;
--           big = '1' when the body was over the storage limit (not stored)
--   code 3: the record was made by a request with another fingerprint
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'owner', 'status', 'headers', 'body', 'big')
if not r[1] then
  -- Absent (every record has a state): nothing to delete first.
  redis.call('HSET', KEYS[1], 'state', 'run', 'owner', ARGV[1], 'fp', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {0, 0, 0, '', '', ''}
end
if r[2] ~= ARGV[2] then
  return {3, 0, 0, '', '', ''}
end
if r[1] == 'run' then
  if r[3] == ARGV[1] then
    -- Our own earlier claim whose reply was lost: keep it, re-arm the lease.
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {0, 0, 0, '', '', ''}
  end
  if ARGV[4] == '1' then
    redis.call('HSET', KEYS[1], 'waited', '1')
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then ttl = 0 end
  return {1, ttl, 0, '', '', ''}
end
return {2, 0, tonumber(r[4]) or 0, r[5] or '', r[6] or '', r[7] or ''}
