-- The fenced store: one record per lock key, updated by read-modify-write.
-- KEYS[1] the record (hash: counter, version, max_fence, max_excl, at,
--         reader, in:<worker>, accepted, rejected), KEYS[2] the write log
--         (list, one entry per accepted write), KEYS[3] the access log
--         (list, one entry per accepted access of any kind, in store order)
-- ARGV[1] 'r' (exclusive read), 'w' (write), 's' (shared read: a read-write
-- lock's reader, a semaphore's holder entering) or 'x' (a shared holder
-- leaving), ARGV[2] fencing token,
-- ARGV[3] '1': reject a token lower than the highest seen; '0': do not check,
-- ARGV[4] worker, ARGV[5] operation, ARGV[6] version read (w),
-- ARGV[7] new counter value (w)
-- Read  -> {1, version, counter} or {0, max_fence} when rejected.
-- Write -> {1, seq} or {0, max_fence} when rejected. A write is applied
--          whatever version it read (no compare-and-set: that would hide the
--          overlaps the checker looks for); the log entry keeps what it read.
-- Exit  -> {1}.
-- Exclusive reads and writes check against max_fence (every token seen, a
-- reader's too) and raise max_fence and max_excl; a shared read checks only
-- against max_excl (readers holding together have tokens in any order) and
-- raises max_fence, so a writer stopped past its lease is refused once a
-- newer reader has read, and a reader stopped past its lease once a newer
-- writer has.
-- A write ends its worker's think time: the record forgets it as the reader,
-- so the harness strikes (SIGSTOP, SIGKILL) only a worker between its read
-- and its write, never one that has moved on to claim its next operation
-- (a kill there would lose an operation the log never saw begin). Shared
-- holders mark themselves `in:<worker>` from their read to their exit.
local kind = ARGV[1]
local function logged(fence)
  local at = redis.call('HINCRBY', KEYS[1], 'at', 1)
  redis.call('RPUSH', KEYS[3],
    at .. ' ' .. kind .. ' ' .. fence .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
end
if kind == 'x' then
  redis.call('HDEL', KEYS[1], 'in:' .. ARGV[4])
  logged(tonumber(ARGV[2]))
  return {1}
end
if kind == 'w' and redis.call('HGET', KEYS[1], 'reader') == ARGV[4] then
  redis.call('HDEL', KEYS[1], 'reader')
end
local max = tonumber(redis.call('HGET', KEYS[1], 'max_fence') or '0')
local fence = tonumber(ARGV[2])
local bar = max
if kind == 's' then
  bar = tonumber(redis.call('HGET', KEYS[1], 'max_excl') or '0')
end
if ARGV[3] == '1' and fence < bar then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, bar}
end
if fence > max then
  redis.call('HSET', KEYS[1], 'max_fence', fence)
end
if kind ~= 's' and fence > tonumber(redis.call('HGET', KEYS[1], 'max_excl') or '0') then
  redis.call('HSET', KEYS[1], 'max_excl', fence)
end
logged(fence)
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if kind == 'r' or kind == 's' then
  if kind == 'r' then
    redis.call('HSET', KEYS[1], 'reader', ARGV[4])
  else
    redis.call('HSET', KEYS[1], 'in:' .. ARGV[4], 1)
  end
  return {1, version, tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')}
end
local seq = version + 1
redis.call('HSET', KEYS[1], 'version', seq, 'counter', ARGV[7])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
redis.call('RPUSH', KEYS[2],
  seq .. ' ' .. fence .. ' ' .. max .. ' ' .. ARGV[6] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
return {1, seq}
