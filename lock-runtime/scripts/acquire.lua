-- Acquire a lock, or join its queue of waiters.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (shared by
-- every key there), KEYS[3] waiter queue, KEYS[4] the key's own counter of
-- earlier versions (all in one hash slot)
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] lease in milliseconds,
-- ARGV[3] how long the caller will wait, in milliseconds ('0': try once, do not queue),
-- ARGV[4] '1' when an earlier attempt of this token may have queued it
-- Returns the fencing token (> 0) when acquired (also when the lock was handed
-- over to this token, or an earlier attempt's reply was lost), or
-- -remaining_lease_ms (<= 0) when held by another owner; a waiting attempt
-- (ARGV[3] ~= '0') gets {-remaining_lease_ms, counter}: the slot counter now,
-- so the waiter can tell a hand-over notice sent after this attempt (a
-- higher token) from a stale one sent before it (a token at most this).
-- The lock's value is its owner's token, followed by '+' once somebody may be
-- queued behind it: only then does a release look at the queue.
-- The next fencing token: the slot counter, first raised past a per-key
-- counter left by an earlier version (then deleted), so no token repeats.
local function next_fence()
  local legacy = redis.call('GET', KEYS[4])
  if legacy then
    if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(legacy) then
      redis.call('SET', KEYS[2], legacy)
    end
    redis.call('DEL', KEYS[4])
  end
  return redis.call('INCR', KEYS[2])
end
-- Free: one write takes it (no read first: the uncontended path is the hot one).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[4] == '1' then
    redis.call('LREM', KEYS[3], 1, ARGV[1] .. ':' .. ARGV[2])
  end
  return next_fence()
end
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] or owner == ARGV[1] .. '+' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- At least the token issued to us (the counter only rises), and below
  -- any token a later owner of this key can get.
  local fence = redis.call('GET', KEYS[2])
  if fence then
    return tonumber(fence)
  end
  return next_fence()
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  -- Set without an expiry by someone else: report our own lease as the wait.
  ttl = tonumber(ARGV[2])
end
if ARGV[3] ~= '0' then
  local member = ARGV[1] .. ':' .. ARGV[2]
  if not redis.call('LPOS', KEYS[3], member) then
    redis.call('RPUSH', KEYS[3], member)
  end
  if string.sub(owner, -1) ~= '+' then
    redis.call('SET', KEYS[1], owner .. '+', 'KEEPTTL')
  end
  -- The queue outlives the longest wait in it plus one lease, then goes.
  local keep = tonumber(ARGV[3]) + tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('PEXPIRE', KEYS[3], keep)
  end
  return {-ttl, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return -ttl
