-- Claim an idempotency record that a plain `SET <record> run:<owner>:<fp>
-- NX PX <lease>` found taken, or report what it holds. Sent only then: a
-- fresh key is claimed by that SET alone.
-- KEYS[1] record, a string: 'run:<owner>:<fp>' in flight ('waited:<owner>:<fp>'
-- once a duplicate waits on it), 'done:<owner>:<fp>:<status>:<big>:<headers
-- length>:<headers><body>' completed (big '1' when the body was over the
-- storage limit, not stored, else '0')
-- ARGV[1] owner token (128 random bits, hex, and public parts; no ':'),
-- ARGV[2] request fingerprint (hex), ARGV[3] in-flight lease in milliseconds,
-- ARGV[4] '1' when the caller will wait for a record in flight (it marks the
-- record, so that its completion or release is announced), else ''
-- Returns {code, remaining_ms, record}:
--   code 0: claimed for ARGV[1] (in flight, expires after the lease)
--   code 1: in flight for another owner, for at most remaining_ms
--   code 2: completed: record is the completed record as stored
--   code 3: the record was made by a request with another fingerprint
local v = redis.call('GET', KEYS[1])
if not v then
  -- Gone since the SET found it (expired, released): ours now.
  redis.call('SET', KEYS[1], 'run:' .. ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
  return {0, 0, ''}
end
local tag_end = string.find(v, ':', 1, true)
local owner_end = tag_end and string.find(v, ':', tag_end + 1, true)
if not owner_end then
  -- Not a record (set by hand): the key is taken by something else.
  return {3, 0, ''}
end
local fp_end = string.find(v, ':', owner_end + 1, true)
if string.sub(v, owner_end + 1, fp_end and fp_end - 1 or -1) ~= ARGV[2] then
  return {3, 0, ''}
end
local tag = string.sub(v, 1, tag_end - 1)
if tag == 'done' then
  return {2, 0, v}
end
if tag ~= 'run' and tag ~= 'waited' then
  return {3, 0, ''}
end
if string.sub(v, tag_end + 1, owner_end - 1) == ARGV[1] then
  -- Our own earlier claim whose reply was lost: keep it, re-arm the lease.
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {0, 0, ''}
end
if tag == 'run' and ARGV[4] == '1' then
  redis.call('SET', KEYS[1], 'waited' .. string.sub(v, tag_end), 'KEEPTTL')
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return {1, ttl, ''}
