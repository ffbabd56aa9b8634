-- Take several locks at once for one owner, all or none (`lock_all`).
-- KEYS: four names per lock i (1-based): KEYS[4i-3] the lock key,
-- KEYS[4i-2] the fencing counter of its hash slot (shared by every key
-- there), KEYS[4i-1] its waiter queue, KEYS[4i] the queue's deadlines (see
-- acquire.lua). On a cluster the caller sends keys of one hash slot only;
-- on one server they may span slots.
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] lease in milliseconds,
-- ARGV[3] hand-over lease cap (ms), ARGV[4] 'PUBLISH', or 'SPUBLISH' on a
-- cluster, ARGV[4 + i] the notice channel of lock i.
-- Returns {0, i, remaining_lease_ms} when lock i is held by another owner
-- (then none of the locks was taken), else {1, fence_1, ..., fence_n}: the
-- fencing token of each lock. Each slot counter is raised once, so the
-- locks of one slot share one token, above every token issued before for
-- any of them.
-- Never queues: a caller that waits takes the keys one at a time through
-- acquire.lua, in the same global order. Nor does it pass anyone in line:
-- a lock found free with live waiters queued for it (its holder's lease ran
-- out) is handed to the first of them, as acquire.lua does, and counts as
-- held by another owner. A key pinned by its line past the end of its
-- owner's lease (a marked value whose deadline has passed: see acquire.lua)
-- counts as free.
local n = #KEYS / 4
local ours = {}
local now

local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

-- Marks lock i as `token`'s, whose lease ends at `deadline`, pinned until
-- the end of the longest wait in its line if that is later (acquire.lua).
local function pin(i, token, deadline)
  local last = redis.call('ZRANGE', KEYS[4 * i], -1, -1, 'WITHSCORES')
  local keep = deadline
  if last[2] and tonumber(last[2]) > keep then
    keep = tonumber(last[2])
  end
  redis.call('SET', KEYS[4 * i - 3], token .. '+' .. deadline, 'PXAT', keep)
end

-- The first entry of lock i's line whose wait has not ended (the others
-- before it dropped), or nil.
local function first_in_line(i)
  local queue, deadlines = KEYS[4 * i - 1], KEYS[4 * i]
  if redis.call('EXISTS', queue) == 0 then
    return nil
  end
  clock()
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil
    end
    local deadline = redis.call('ZSCORE', deadlines, head)
    if not deadline or tonumber(deadline) > now then
      return head
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, head)
  end
end

for i = 1, n do
  local key = KEYS[4 * i - 3]
  local owner = redis.call('GET', key)
  local holder, ends = owner, nil
  if owner then
    local sep = string.find(owner, '+', 1, true)
    if sep then
      holder = string.sub(owner, 1, sep - 1)
      ends = tonumber(string.sub(owner, sep + 1))
    end
    if ends and ends <= clock() then
      owner = false -- the owner's lease ended: free, but for its line
    end
  end
  if not owner then
    local head = first_in_line(i)
    if head then
      -- Somebody waits for it: hand it over (release.lua's hand-over).
      redis.call('LPOP', KEYS[4 * i - 1])
      redis.call('ZREM', KEYS[4 * i], head)
      local sep = string.find(head, ':', 1, true)
      local token = string.sub(head, 1, sep - 1)
      local lease = math.min(tonumber(string.sub(head, sep + 1)), tonumber(ARGV[3]))
      local fence = redis.call('INCR', KEYS[4 * i - 2])
      pin(i, token, clock() + lease)
      redis.pcall(ARGV[4], ARGV[4 + i], redis.sha1hex(token) .. ':' .. fence)
      return {0, i, lease}
    end
  elseif holder ~= ARGV[1] then
    local ttl = ends and ends - clock() or redis.call('PTTL', key)
    if ttl < 0 then
      -- Set without an expiry by someone else: report our own lease.
      ttl = tonumber(ARGV[2])
    end
    return {0, i, ttl}
  else
    -- Ours already: an earlier copy of this call ran and its reply was lost.
    ours[i] = ends or 0
  end
end
local fences = {}
local answer = {1}
for i = 1, n do
  local counter = KEYS[4 * i - 2]
  if not fences[counter] then
    fences[counter] = redis.call('INCR', counter)
  end
  if ours[i] and ours[i] > 0 then
    -- Marked: somebody queued behind us; keep the mark, with our new
    -- deadline, and the pin.
    pin(i, ARGV[1], clock() + tonumber(ARGV[2]))
  elseif ours[i] then
    redis.call('PEXPIRE', KEYS[4 * i - 3], ARGV[2])
  else
    redis.call('SET', KEYS[4 * i - 3], ARGV[1], 'PX', ARGV[2])
  end
  answer[i + 1] = fences[counter]
end
return answer
