-- Read-write locks and semaphores: acquire, release, extend and mint.
-- KEYS[1] writer key (a string holding the writer's token; never set for a
-- semaphore), KEYS[2] holders (a sorted set: readers' or permit holders'
-- tokens scored by the end of their leases, server time in ms), KEYS[3]
-- waiter queue (a list of 'token:lease_ms:mode:limit' entries: each
-- waiter's own lease, mode and limit), KEYS[4] fencing counter of the
-- key's hash slot, KEYS[5] the fencing tokens of the shared holders that
-- have one (a hash: token -> fencing token; its members are among
-- KEYS[2]'s, and it lives as long as they do), KEYS[6] the queue's
-- deadlines (a sorted set: each entry scored by the end of its wait,
-- server time in ms) (all in one hash slot)
-- ARGV[1] op: 'acquire', 'release', 'extend' or 'mint'
-- ARGV[2] owner token (128 random bits, hex), ARGV[3] lease in milliseconds,
-- ARGV[4] mode: 's' shared (a reader, a permit) or 'x' exclusive (a writer),
-- ARGV[5] how many shared holders at most ('0': no limit, a read-write
-- lock; above 0 only for a semaphore, which has no writer): the caller's
-- own count; a queued waiter is granted by its own, which its entry keeps
-- ARGV[6] notice channel, ARGV[7] hand-over lease cap (ms), ARGV[8]
-- 'PUBLISH', or 'SPUBLISH' on a cluster
-- acquire: ARGV[9] how long the caller will wait, in ms ('0': try once, do
--   not queue). Returns {1, fence, grants...} when held (also when handed
--   over, or an earlier attempt's reply was lost; fence 0: none minted
--   yet, ask with 'mint'), or 1 alone (held, no token, no grants: a table
--   costs the server as much as a command); {-remaining_ms, counter,
--   grants...} when busy (counter: the slot counter now, see acquire.lua).
--   grants: sha1hex(token), fencing for each waiter the call handed over
--   to (a lease that ended made room for them).
-- release: ARGV[9] '1' to leave the queue too (an abandoned wait). Returns
--   {1, grants...} when released, {0, grants...} when not ours; 1 or 0
--   alone when it granted nobody.
-- extend: returns 1 when re-armed, 0 when not ours.
-- mint: the holder's fencing token, minted now (INCR), strictly above
--   every token issued before in the slot; 0 when not ours (absent, or its
--   lease ended): a holder whose lease ended never gets a token. A newcomer
--   that takes a free lock gets no token (nobody may ask for it); a waiter
--   granted by a hand-over gets its token with the grant, in its notice.
-- Waiting is FIFO: whenever capacity frees up, the entries at the head of
-- the queue are granted, in order, while they fit (a writer alone; shared
-- holders while below the waiter's own limit and no writer holds), each
-- with a lease capped at the hand-over cap and a notice
-- '<sha1hex(token)>:<fencing>'. Entries whose wait has ended (a waiter that
-- died in line) are skipped. A newcomer is admitted only when nobody is
-- queued, so a waiting writer is not starved by readers arriving after it.
local op, token, lease, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local limit = tonumber(ARGV[5])
local t = redis.call('TIME')
-- Whole milliseconds: an integer is a cheap argument, a fraction is not.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Holders whose lease ended are gone: every step that reads the holders'
-- set runs this first, or reads only what no ended lease can be in (an
-- empty set, a score it compares with `now`). How many went.
local function purge()
  local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  if #ended > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    for _, who in ipairs(ended) do
      redis.call('HDEL', KEYS[5], who)
    end
  end
  return #ended
end

-- The common calls first, before any helper is defined (a helper is a
-- closure made anew on every call, which costs the server as much as a
-- command): a release, and a newcomer, while nobody is queued.
local released
if op == 'release' then
  if ARGV[9] == '1' then
    local entry = token .. ':' .. ARGV[3] .. ':' .. mode .. ':' .. ARGV[5]
    redis.call('LREM', KEYS[3], 1, entry)
    redis.call('ZREM', KEYS[6], entry)
  end
  released = 0
  if mode == 'x' then
    if redis.call('GET', KEYS[1]) == token then
      redis.call('DEL', KEYS[1])
      released = 1
    end
  else
    local ends = redis.call('ZSCORE', KEYS[2], token)
    if ends then
      redis.call('ZREM', KEYS[2], token)
      redis.call('HDEL', KEYS[5], token)
      -- A lease that ended is gone all the same, and was not ours.
      if tonumber(ends) > now then
        released = 1
      end
    end
  end
  -- Nobody queued: nobody to grant. Else, also when not ours (the entry
  -- that left, or a lease that ended, may have made room), the queue's
  -- head is granted below.
  if not redis.call('LINDEX', KEYS[3], 0) then
    return released
  end
elseif op == 'acquire' and not redis.call('LINDEX', KEYS[3], 0) then
  -- A newcomer, only when nobody is queued. It takes a lease without a
  -- token if it fits (as `room` and `take` below); a re-sent attempt
  -- whose first copy took a shared lease is counted among the holders
  -- here, and only refreshed.
  if limit > 0 or redis.call('EXISTS', KEYS[1]) == 0 then
    local held = redis.call('ZCARD', KEYS[2])
    if held > 0 then
      held = held - purge()
    end
    -- (ARGV[3], the lease as sent: a number costs a conversion.)
    if mode == 'x' and held == 0 then
      redis.call('SET', KEYS[1], token, 'PX', ARGV[3])
      return 1
    elseif mode ~= 'x' and (limit == 0 or held < limit) then
      redis.call('ZADD', KEYS[2], now + lease, token)
      if held == 0 then
        redis.call('PEXPIRE', KEYS[2], ARGV[3])
      else
        redis.call('PEXPIRE', KEYS[2], ARGV[3], 'GT')
      end
      return 1
    end
  end
end

-- Every other call reads the holders' set below.
purge()

-- The holders' set lives as long as the longest lease, and so do the
-- tokens: `alone` when nobody else holds (the set is new, with no expiry
-- to keep); else the expiry only grows (GT).
local function hold_shared(who, ms, alone)
  redis.call('ZADD', KEYS[2], now + ms, who)
  if alone then
    redis.call('PEXPIRE', KEYS[2], ms)
  else
    redis.call('PEXPIRE', KEYS[2], ms, 'GT')
  end
end

-- Our shared lease re-armed to the full lease, and our token kept as long.
local function rearm_shared()
  hold_shared(token, lease, false)
  redis.call('PEXPIRE', KEYS[5], lease, 'GT')
end

local function ours()
  if mode == 'x' then
    return redis.call('GET', KEYS[1]) == token
  end
  return redis.call('ZSCORE', KEYS[2], token) ~= false
end

-- How many shared holders there are, when one of mode `m` with the limit
-- `most` fits beside them; false when it does not.
local function room(m, most)
  if most == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
    return false
  end
  local held = redis.call('ZCARD', KEYS[2])
  if m == 'x' then
    return held == 0 and held
  end
  return (most == 0 or held < most) and held
end

-- The token of a grant made by a hand-over (the waiter learns it from its
-- notice): minted with the grant.
local function minted(who, m)
  local fence = redis.call('INCR', KEYS[4])
  if m ~= 'x' then
    redis.call('HSET', KEYS[5], who, fence)
    redis.call('PEXPIRE', KEYS[5], redis.call('PTTL', KEYS[2]))
  end
  return fence
end

local function take(who, m, ms, held)
  if m == 'x' then
    redis.call('SET', KEYS[1], who, 'PX', ms)
  else
    hold_shared(who, ms, held == 0)
  end
end

-- Grants the head of the queue while it fits, each entry by its own
-- limit, and skips the entries whose wait has ended (their waiters gave up
-- or died in line; an entry with no deadline, or the caller's own, waits
-- on); the caller's own entry is granted like any other (and not
-- notified). Returns whether the queue is empty now, and the token of the
-- caller's own grant (0: none); the grants made for others go to
-- `granted`: sha1hex(token), fencing, ...
local function promote(granted)
  local channel, cap, publish = ARGV[6], tonumber(ARGV[7]), ARGV[8]
  local own = 0
  while true do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then
      return true, own
    end
    local a = string.find(head, ':', 1, true)
    local b = string.find(head, ':', a + 1, true)
    local c = string.find(head, ':', b + 1, true)
    local who = string.sub(head, 1, a - 1)
    local ms = math.min(tonumber(string.sub(head, a + 1, b - 1)), cap)
    -- (An entry of an earlier version names no limit: the caller's.)
    local m, most = string.sub(head, b + 1), limit
    if c then
      m, most = string.sub(head, b + 1, c - 1), tonumber(string.sub(head, c + 1))
    end
    local ends = redis.call('ZSCORE', KEYS[6], head)
    if who ~= token and ends and tonumber(ends) <= now then
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[6], head)
    else
      local held = room(m, most)
      if not held then
        return false, own
      end
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[6], head)
      take(who, m, ms, held)
      local fence = minted(who, m)
      if who == token then
        own = fence
      else
        local id = redis.sha1hex(who)
        -- pcall: a notice refused by an ACL must not undo the grant.
        redis.pcall(publish, channel, id .. ':' .. fence)
        granted[#granted + 1] = id
        granted[#granted + 1] = fence
      end
      if m == 'x' then
        return redis.call('EXISTS', KEYS[3]) == 0, own
      end
    end
  end
end

if op == 'release' then
  local out = {released}
  promote(out)
  return out
end

if op == 'extend' or op == 'mint' then
  if not ours() then
    return 0
  end
  if op == 'mint' then
    return minted(token, mode)
  end
  if mode == 'x' then
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    rearm_shared()
  end
  return 1
end

-- acquire: grant whoever waits at the head first (capacity may have freed
-- up by a lease ending, which sends no notice); we may be among them.
local waits = ARGV[9] ~= '0'
local out = {1, 0}
local empty, own = promote(out)
-- A newcomer again (see above), now that the head may have been granted.
if empty then
  local held = room(mode, limit)
  if held then
    take(token, mode, lease, held)
    out[2] = own
    return out
  end
end
if ours() then
  -- Held already (granted just now, handed over, or a re-sent attempt):
  -- the full lease, and the token issued to us (0: none yet).
  if mode == 'x' then
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    rearm_shared()
    own = tonumber(redis.call('HGET', KEYS[5], token) or '0')
  end
  out[2] = own
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
  local entry = token .. ':' .. ARGV[3] .. ':' .. mode .. ':' .. ARGV[5]
  if not redis.call('LPOS', KEYS[3], entry) then
    redis.call('RPUSH', KEYS[3], entry)
  end
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[9]), entry)
  local keep = tonumber(ARGV[9]) + lease
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('PEXPIRE', KEYS[3], keep)
  end
  if redis.call('PTTL', KEYS[6]) < keep then
    redis.call('PEXPIRE', KEYS[6], keep)
  end
  out[2] = tonumber(redis.call('GET', KEYS[4]) or '0')
end
return out
