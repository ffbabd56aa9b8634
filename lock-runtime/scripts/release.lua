-- Release a lock we hold and hand it to the first waiter in line.
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's slot, KEYS[3] waiter
-- queue, KEYS[4] the queue's deadlines (see acquire.lua) (one hash slot)
-- ARGV[1] owner token, ARGV[2] how notices go: 'PUBLISH <channel>', or
-- 'SPUBLISH <channel>' on a cluster (chosen by the library), ARGV[3] '1' to
-- announce a release that hands over to nobody (Redlock, whose waiters do not
-- queue), absent or '0' when every waiter queues, ARGV[4] our own queue entry
-- to drop first (absent when we never queued)
-- (As in acquire.lua: arguments cost the server on every call, so the
-- plain release sends two, and the hand-over lease cap is a constant.)
-- Returns 0 when the key is absent or held by another owner; when released,
-- {1, sha1hex(new_owner_token), fencing} after a hand-over, else 1.
-- Notice payload: '<sha1hex(token)>:<fencing>' naming the new owner without
-- revealing its token, or '' (free).
-- A value without the '+' mark (see acquire.lua) means nobody queued behind
-- this owner, so the queue is not even looked at. A marked value whose
-- owner's deadline has passed is no longer ours (the lease ended; the key
-- is only pinned for the line): 0, and the first script call that finds
-- it so hands it to the line.
-- The plain release (nobody queued) does not come here on its own: the
-- client sends the server's compare-and-delete first (DELIFEQ, or the
-- minimal script unlock.lua) and calls this script when that deleted
-- nothing.
-- A leader election passes KEYS[5] the leader's record and KEYS[6] the
-- candidates' labels (see acquire.lua): a hand-over writes the new leader's
-- record, a release to nobody deletes it and publishes '' (no leader).
if ARGV[4] then
  redis.call('LREM', KEYS[3], 1, ARGV[4])
  redis.call('ZREM', KEYS[4], ARGV[4])
  if KEYS[6] then
    redis.call('HDEL', KEYS[6], ARGV[1])
  end
end
local owner = redis.call('GET', KEYS[1])
-- Server time (ms), read only for a marked value: the plain release has no
-- use for it. (No helper functions: a closure is made anew on every call,
-- which costs the server as much as a command.)
local now
if owner ~= ARGV[1] then
  if not owner or string.sub(owner, 1, #ARGV[1] + 1) ~= ARGV[1] .. '+' then
    return 0
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ends = tonumber(string.sub(owner, #ARGV[1] + 2))
  if ends and ends <= now then
    return 0
  end
end
if not now and ARGV[3] ~= '1' and not KEYS[5] then
  -- The plain release: nobody queued, nobody to tell.
  redis.call('DEL', KEYS[1])
  return 1
end
-- See acquire.lua's HAND_OVER_CAP. The notice's pcall: a notice refused by
-- an ACL must not undo the release; waiters then wake at their lease
-- timers instead.
local HAND_OVER_CAP = 2000
local sep = string.find(ARGV[2], ' ', 1, true)
local publish, channel = string.sub(ARGV[2], 1, sep - 1), string.sub(ARGV[2], sep + 1)
if now then
  -- Somebody queued: the first entry whose wait has not ended (a waiter
  -- that died in line is skipped once its wait is over).
  local entry = redis.call('LPOP', KEYS[3])
  while entry do
    local deadline = redis.call('ZSCORE', KEYS[4], entry)
    redis.call('ZREM', KEYS[4], entry)
    if not deadline or tonumber(deadline) > now then
      break
    end
    entry = redis.call('LPOP', KEYS[3])
  end
  if entry then
    local split = string.find(entry, ':', 1, true)
    local token = string.sub(entry, 1, split - 1)
    local lease = math.min(tonumber(string.sub(entry, split + 1)), HAND_OVER_CAP)
    local fence = redis.call('INCR', KEYS[2])
    -- Marked with the new owner's deadline, and pinned until the end of
    -- the longest wait still in line (see acquire.lua). The SET replaces
    -- our value: no DEL first.
    local ends = now + lease
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    local keep = ends
    if last[2] and tonumber(last[2]) > keep then
      keep = tonumber(last[2])
    end
    redis.call('SET', KEYS[1], token .. '+' .. ends, 'PXAT', keep)
    if KEYS[5] then
      local label = redis.call('HGET', KEYS[6], token) or ''
      redis.call('SET', KEYS[5], fence .. ':' .. label, 'PX', lease)
      redis.call('HDEL', KEYS[6], token)
    end
    local id = redis.sha1hex(token)
    redis.pcall(publish, channel, id .. ':' .. fence)
    return {1, id, fence}
  end
end
redis.call('DEL', KEYS[1])
if KEYS[5] then
  redis.call('DEL', KEYS[5])
end
if ARGV[3] == '1' or KEYS[5] then
  redis.pcall(publish, channel, '')
end
return 1
