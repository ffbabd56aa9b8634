-- Read-write locks and semaphores: acquire, release and extend.
-- KEYS[1] writer key (a string holding the writer's token; never set for a
-- semaphore), KEYS[2] holders (a sorted set: readers' or permit holders'
-- tokens scored by the end of their leases, server time in ms), KEYS[3]
-- waiter queue (a list of 'token:lease_ms:mode' entries), KEYS[4] fencing
-- counter of the key's hash slot, KEYS[5] the shared holders' fencing
-- tokens (a hash: token -> fencing token; the same members and lifetime as
-- KEYS[2]) (all in one hash slot)
-- ARGV[1] op: 'acquire', 'release' or 'extend'
-- ARGV[2] owner token (128 random bits, hex), ARGV[3] lease in milliseconds,
-- ARGV[4] mode: 's' shared (a reader, a permit) or 'x' exclusive (a writer),
-- ARGV[5] how many shared holders at most ('0': no limit, a read-write lock)
-- ARGV[6] notice channel, ARGV[7] hand-over lease cap (ms), ARGV[8]
-- 'PUBLISH', or 'SPUBLISH' on a cluster
-- acquire: ARGV[9] how long the caller will wait, in ms ('0': try once, do
--   not queue). Returns {fence, grants...} when held (fence > 0; also when
--   handed over, or an earlier attempt's reply was lost); {-remaining_ms,
--   counter, grants...} when busy (counter: the slot counter now, see
--   acquire.lua). grants: sha1hex(token), fencing for each waiter the call
--   handed over to (a lease that ended made room for them).
-- release: ARGV[9] '1' to leave the queue too (an abandoned wait). Returns
--   {1, grants...} when released, {0, grants...} when not ours.
-- extend: returns 1 when re-armed, 0 when not ours.
-- Waiting is FIFO: whenever capacity frees up, the entries at the head of
-- the queue are granted, in order, while they fit (a writer alone; shared
-- holders while below the limit and no writer holds), each with a lease
-- capped at the hand-over cap and a notice '<sha1hex(token)>:<fencing>'.
-- A newcomer is admitted only when nobody is queued, so a waiting writer is
-- not starved by readers arriving after it.
local op, token, lease, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local limit = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Holders whose lease ended are gone.
local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #ended > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, who in ipairs(ended) do
    redis.call('HDEL', KEYS[5], who)
  end
end

-- The holders' set (and their tokens) live as long as the longest lease.
local function hold_shared(who, ms)
  redis.call('ZADD', KEYS[2], now + ms, who)
  if redis.call('PTTL', KEYS[2]) < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
    redis.call('PEXPIRE', KEYS[5], ms)
  end
end

local function ours()
  if mode == 'x' then
    return redis.call('GET', KEYS[1]) == token
  end
  return redis.call('ZSCORE', KEYS[2], token) ~= false
end

local function fits(m)
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return false
  end
  local held = redis.call('ZCARD', KEYS[2])
  if m == 'x' then
    return held == 0
  end
  return limit == 0 or held < limit
end

local function take(who, m, ms)
  local fence = redis.call('INCR', KEYS[4])
  if m == 'x' then
    redis.call('SET', KEYS[1], who, 'PX', ms)
  else
    redis.call('HSET', KEYS[5], who, fence)
    hold_shared(who, ms)
  end
  return fence
end

-- Grants the head of the queue while it fits; the caller's own entry is
-- granted like any other (and not notified). Returns the grants made for
-- others: sha1hex(token), fencing, ...
local function promote(granted)
  local channel, cap, publish = ARGV[6], tonumber(ARGV[7]), ARGV[8]
  while true do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then
      break
    end
    local a = string.find(head, ':', 1, true)
    local b = string.find(head, ':', a + 1, true)
    local who = string.sub(head, 1, a - 1)
    local ms = math.min(tonumber(string.sub(head, a + 1, b - 1)), cap)
    local m = string.sub(head, b + 1)
    if not fits(m) then
      break
    end
    redis.call('LPOP', KEYS[3])
    local fence = take(who, m, ms)
    if who ~= token then
      local id = redis.sha1hex(who)
      -- pcall: a notice refused by an ACL must not undo the grant.
      redis.pcall(publish, channel, id .. ':' .. fence)
      granted[#granted + 1] = id
      granted[#granted + 1] = fence
    end
    if m == 'x' then
      break
    end
  end
end

local function counter()
  return tonumber(redis.call('GET', KEYS[4]) or '0')
end

if op == 'extend' then
  if not ours() then
    return 0
  end
  if mode == 'x' then
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    hold_shared(token, lease)
  end
  return 1
end

local entry = token .. ':' .. ARGV[3] .. ':' .. mode

if op == 'release' then
  if ARGV[9] == '1' then
    redis.call('LREM', KEYS[3], 1, entry)
  end
  local out = {0}
  if ours() then
    out[1] = 1
    if mode == 'x' then
      redis.call('DEL', KEYS[1])
    else
      redis.call('ZREM', KEYS[2], token)
      redis.call('HDEL', KEYS[5], token)
    end
  end
  -- Also when not ours: the entry that left, or a lease that ended, may
  -- have made room for those queued behind.
  promote(out)
  return out
end

-- acquire: grant whoever waits at the head first (capacity may have freed
-- up by a lease ending, which sends no notice); we may be among them.
local waits = ARGV[9] ~= '0'
local out = {0, 0}
promote(out)
if ours() then
  -- Held already (granted just now, handed over, or a re-sent attempt):
  -- the full lease, and the token issued to us (a writer's is the counter:
  -- nothing was granted since).
  local fence
  if mode == 'x' then
    redis.call('PEXPIRE', KEYS[1], lease)
    fence = counter()
  else
    hold_shared(token, lease)
    fence = tonumber(redis.call('HGET', KEYS[5], token) or '0')
  end
  if fence == 0 then
    fence = redis.call('INCR', KEYS[4])
  end
  out[1] = fence
  return out
end
if redis.call('LLEN', KEYS[3]) == 0 and fits(mode) then
  out[1] = take(token, mode, lease)
  return out
end
-- Busy until the earliest lease that could make room ends.
local remaining = redis.call('PTTL', KEYS[1])
if remaining < 0 then
  remaining = lease
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then
  remaining = math.min(remaining, math.max(tonumber(first[2]) - now, 1))
end
out[1] = -remaining
if waits then
  if not redis.call('LPOS', KEYS[3], entry) then
    redis.call('RPUSH', KEYS[3], entry)
  end
  local keep = tonumber(ARGV[9]) + lease
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('PEXPIRE', KEYS[3], keep)
  end
  out[2] = counter()
end
return out
