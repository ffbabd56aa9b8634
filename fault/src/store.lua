-- The fenced store: one record per lock key, updated by read-modify-write.
-- KEYS[1] the record (hash: counter, version, max_fence, reader, accepted,
--         rejected), KEYS[2] the write log (list, one entry per accepted write)
-- ARGV[1] 'r' (read) or 'w' (write), ARGV[2] fencing token,
-- ARGV[3] '1': reject a token lower than the highest seen; '0': do not check,
-- ARGV[4] worker, ARGV[5] operation, ARGV[6] version read (w),
-- ARGV[7] new counter value (w)
-- Read  -> {1, version, counter} or {0, max_fence} when rejected.
-- Write -> {1, seq} or {0, max_fence} when rejected. A write is applied
--          whatever version it read (no compare-and-set: that would hide the
--          overlaps the checker looks for); the log entry keeps what it read.
-- A write ends its worker's think time: the record forgets it as the reader,
-- so the harness strikes (SIGSTOP, SIGKILL) only a worker between its read
-- and its write, never one that has moved on to claim its next operation
-- (a kill there would lose an operation the log never saw begin).
if ARGV[1] == 'w' and redis.call('HGET', KEYS[1], 'reader') == ARGV[4] then
  redis.call('HDEL', KEYS[1], 'reader')
end
local max = tonumber(redis.call('HGET', KEYS[1], 'max_fence') or '0')
local fence = tonumber(ARGV[2])
if ARGV[3] == '1' and fence < max then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, max}
end
if fence > max then
  redis.call('HSET', KEYS[1], 'max_fence', fence)
end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if ARGV[1] == 'r' then
  redis.call('HSET', KEYS[1], 'reader', ARGV[4])
  return {1, version, tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')}
end
local seq = version + 1
redis.call('HSET', KEYS[1], 'version', seq, 'counter', ARGV[7])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
redis.call('RPUSH', KEYS[2],
  seq .. ' ' .. fence .. ' ' .. max .. ' ' .. ARGV[6] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
return {1, seq}
