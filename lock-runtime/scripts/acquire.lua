-- Acquire a lock, or join its queue of waiters.
-- The uncontended acquire does not come here: the client sends a plain
-- `SET key token NX PX ttl` first and calls this script only when that
-- found the key taken (or for what a plain SET cannot do: a leader
-- election, a re-send, a waiter already in line, a batched call).
-- KEYS[1] lock key, KEYS[2] fencing counter of the key's hash slot (shared by
-- every key there), KEYS[3] waiter queue (a list of 'token:lease_ms' entries,
-- in arrival order), KEYS[4] the queue's deadlines (a sorted set: each entry
-- scored by the end of its wait, server time in ms) (all in one hash slot)
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] lease in milliseconds,
-- ARGV[3] how notices go: 'PUBLISH <channel>', or 'SPUBLISH <channel>' on a
-- cluster (chosen by the library), ARGV[4] how long the caller will wait, in
-- milliseconds (absent or '0': try once, do not queue)
-- Arguments cost the server on every call (about as much as a short
-- command each): what only the rare paths use is packed (ARGV[3]) or left
-- out (ARGV[4]), and the hand-over lease cap is a constant (HAND_OVER_CAP).
-- Returns the fencing token (> 0) when acquired (also when the lock was handed
-- over to this token, or an earlier attempt's reply was lost), or
-- -remaining_lease_ms (<= 0) when held by another owner; a waiting attempt
-- (ARGV[4] given and not '0') gets {-remaining_lease_ms, counter}: the slot counter now,
-- so the waiter can tell a hand-over notice sent after this attempt (a
-- higher token) from a stale one sent before it (a token at most this).
--
-- The lock's value is its owner's token while nobody waits for it. Once
-- somebody queues, it is marked: 'token+deadline', the end of the owner's
-- lease (server time, ms), and the key itself is pinned: it lives until
-- that deadline or the end of the longest wait in line, whichever is later.
-- So while a line exists the key exists, and a plain `SET NX` from a
-- newcomer can never pass the line, even after the owner crashed: the key
-- outlives the owner's lease, and the first script call after that
-- deadline (a waiter woken by its timer, or a newcomer) hands the key to
-- the head of the line, as a release would.
-- Waiting is FIFO: entries whose wait has ended (a waiter that died in
-- line) are skipped.
-- A leader election passes two more names, KEYS[5] the leader's record and
-- KEYS[6] the candidates' labels (a hash by token), ARGV[4] always, and
-- ARGV[5] our label:
-- every grant then writes the record, '<term>:<label>' expiring with the
-- lease, and publishes the new owner, so observers follow every change.

-- Free: one write takes it (no read first), and one lookup tells that
-- nobody queues for it. That path returns before anything else is built
-- (the strings and functions below cost the server instructions on every
-- call they are made).
local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local lined = granted and redis.call('EXISTS', KEYS[3]) == 1
if granted and not lined and not KEYS[5] then
  return redis.call('INCR', KEYS[2])
end

local member = ARGV[1] .. ':' .. ARGV[2]
local wait = tonumber(ARGV[4] or '0')
-- The most a hand-over grants before its new owner confirms (ms): the
-- client's HANDOFF_LEASE (backend/mod.rs; a test there pins the two).
local HAND_OVER_CAP = 2000

local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

-- Marks the key as `token`'s, whose lease ends at `deadline`, and pins it
-- until the end of the longest wait in line if that is later.
local function pin(token, deadline)
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  local keep = deadline
  if last[2] and tonumber(last[2]) > keep then
    keep = tonumber(last[2])
  end
  redis.call('SET', KEYS[1], token .. '+' .. deadline, 'PXAT', keep)
end

-- Publishes `payload` on the key's notice channel. pcall: a notice refused
-- by an ACL must not undo what the script did; waiters then wake at their
-- lease timers instead.
local function notify(payload)
  local sep = string.find(ARGV[3], ' ', 1, true)
  redis.pcall(string.sub(ARGV[3], 1, sep - 1), string.sub(ARGV[3], sep + 1), payload)
end

local function crown(token, fence, lease, label)
  redis.call('SET', KEYS[5], fence .. ':' .. label, 'PX', lease)
  redis.call('HDEL', KEYS[6], token)
end

-- Granted to us without a hand-over: our fencing token.
local function ours()
  local fence = redis.call('INCR', KEYS[2])
  if KEYS[5] then
    crown(ARGV[1], fence, ARGV[2], ARGV[5])
    notify(redis.sha1hex(ARGV[1]) .. ':' .. fence)
  end
  return fence
end

-- Who holds the key and until when: `ends` is the owner's deadline when
-- the value is marked (nil when not, or marked by an older client without
-- one: then the key's own expiry is the lease).
local owner, holder, ends
if not granted then
  owner = redis.call('GET', KEYS[1])
  local sep = string.find(owner, '+', 1, true)
  if sep then
    holder = string.sub(owner, 1, sep - 1)
    ends = tonumber(string.sub(owner, sep + 1))
  else
    holder = owner
  end
end

-- Free, or pinned by a line past the end of its owner's lease (an owner
-- that crashed or was paused): the first live entry gets it.
if granted or (ends and ends <= clock()) then
  local head
  while true do
    head = redis.call('LINDEX', KEYS[3], 0)
    if not head then
      break
    end
    local deadline = redis.call('ZSCORE', KEYS[4], head)
    if head == member or not deadline or tonumber(deadline) > clock() then
      break
    end
    -- Its wait is over: the waiter gave up (or died) without leaving.
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], head)
  end
  if head == member or not head then
    if head then
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[4], head)
    end
    if redis.call('LLEN', KEYS[3]) > 0 then
      -- Marked and pinned: more waiters stand behind us.
      pin(ARGV[1], clock() + tonumber(ARGV[2]))
    elseif not granted then
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    end
    return ours()
  end
  -- Somebody else is first in line: hand it over, as release.lua does.
  redis.call('LPOP', KEYS[3])
  redis.call('ZREM', KEYS[4], head)
  local sep = string.find(head, ':', 1, true)
  local token = string.sub(head, 1, sep - 1)
  local lease = math.min(tonumber(string.sub(head, sep + 1)), HAND_OVER_CAP)
  local fence = redis.call('INCR', KEYS[2])
  pin(token, clock() + lease)
  if KEYS[5] then
    crown(token, fence, lease, redis.call('HGET', KEYS[6], token) or '')
  end
  notify(redis.sha1hex(token) .. ':' .. fence)
  holder, ends = token, clock() + lease
end

if holder == ARGV[1] then
  -- Ours already: an earlier copy of this attempt (or a plain SET) took it
  -- and its reply was lost. Re-armed to a full lease.
  if ends then
    pin(ARGV[1], clock() + tonumber(ARGV[2]))
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  if KEYS[5] then
    -- A leader's term is the one its grant wrote in the record (ours while
    -- the key is ours), re-armed with the lease: a hand-over wrote it with
    -- the hand-over's short lease. Gone (it ran out before this confirm): a
    -- new term, written and announced as a grant's, so observers and the
    -- leader name the same term.
    local record = redis.call('GET', KEYS[5])
    if record then
      redis.call('PEXPIRE', KEYS[5], ARGV[2])
      return tonumber(string.sub(record, 1, string.find(record, ':', 1, true) - 1))
    end
    return ours()
  end
  -- A plain SET takes the key without a token: minted now, while ours.
  return redis.call('INCR', KEYS[2])
end
local ttl
if ends then
  ttl = ends - clock()
else
  ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    -- Set without an expiry by someone else: report our own lease as the wait.
    ttl = tonumber(ARGV[2])
  end
end
if wait > 0 then
  -- Queued already? Every script that adds to or takes from the list does
  -- the same to the deadlines (same members, same expiry), so the sorted
  -- set answers in O(1) what a scan of the list (`LPOS`) would in O(n).
  if not redis.call('ZSCORE', KEYS[4], member) then
    redis.call('RPUSH', KEYS[3], member)
    redis.call('ZADD', KEYS[4], clock() + wait, member)
  end
  local keep = wait + tonumber(ARGV[2])
  if KEYS[6] then
    redis.call('HSET', KEYS[6], ARGV[1], ARGV[5])
    if redis.call('PTTL', KEYS[6]) < keep then
      redis.call('PEXPIRE', KEYS[6], keep)
    end
  end
  -- The queue outlives the longest wait in it plus one lease, then goes.
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
  end
  -- Marked with the owner's deadline, and pinned past our wait's end.
  pin(holder, clock() + ttl)
  return {-ttl, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return -ttl
