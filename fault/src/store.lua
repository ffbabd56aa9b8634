-- The store's shared accesses: a read-write lock's reader, a semaphore's
-- holder. Exclusive reads and writes do not come here: they go through the
-- library's `fence::redis` (store.rs), whose record of the highest token
-- this script raises too.
-- KEYS[1] the record (hash: counter, version, reader, in:<worker>, accepted,
--         rejected), KEYS[2] the access log (list, one entry
--         `kind fence worker op` per accepted access of any kind, in store
--         order), KEYS[3] the highest exclusive token (sorted set, member
--         `max`, kept by the fenced exclusive accesses with ZADD GT),
--         KEYS[4] `fence::redis`'s record of the highest token (a string)
-- ARGV[1] 's' (shared read: a reader, a semaphore's holder entering) or 'x'
-- (a shared holder leaving), ARGV[2] fencing token, ARGV[3] '1': refuse a
-- token lower than the highest exclusive one; '0': do not check,
-- ARGV[4] worker, ARGV[5] operation, ARGV[6] the record's retention (ms)
-- Shared read -> {1, version, counter} or {0, highest exclusive} when refused.
-- Exit        -> {1}.
-- A shared read checks only against the highest exclusive token (readers
-- holding together have tokens in any order) and raises `fence::redis`'s
-- record, so a writer stopped past its lease is refused once a newer reader
-- has read, and a reader stopped past its lease once a newer writer has.
-- Shared holders mark themselves `in:<worker>` from their read to their
-- exit (the harness strikes only a holder between the two).
local kind = ARGV[1]
local fence = tonumber(ARGV[2])
local function logged()
  redis.call('RPUSH', KEYS[2], kind .. ' ' .. ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
end
if kind == 'x' then
  redis.call('HDEL', KEYS[1], 'in:' .. ARGV[4])
  logged()
  return {1}
end
local bar = tonumber(redis.call('ZSCORE', KEYS[3], 'max') or '0')
if ARGV[3] == '1' and fence < bar then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, bar}
end
local highest = redis.call('GET', KEYS[4])
if not highest or tonumber(highest) < fence then
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[6])
end
logged()
redis.call('HSET', KEYS[1], 'in:' .. ARGV[4], 1)
local record = redis.call('HMGET', KEYS[1], 'version', 'counter')
return {1, tonumber(record[1] or '0'), tonumber(record[2] or '0')}
