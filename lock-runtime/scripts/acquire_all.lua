-- Take several locks at once for one owner, all or none (`lock_all`).
-- KEYS: three names per lock i (1-based): KEYS[3i-2] the lock key,
-- KEYS[3i-1] the fencing counter of its hash slot (shared by every key
-- there), KEYS[3i] the key's own counter of earlier versions. On a cluster
-- the caller sends keys of one hash slot only; on one server they may span
-- slots.
-- ARGV[1] owner token (128 random bits, hex), ARGV[2] lease in milliseconds.
-- Returns {0, i, remaining_lease_ms} when lock i is held by another owner
-- (then nothing was written), else {1, fence_1, ..., fence_n}: the fencing
-- token of each lock. Each slot counter is raised once, so the locks of one
-- slot share one token, above every token issued before for any of them.
-- Never queues: a caller that waits takes the keys one at a time through
-- acquire.lua, in the same global order.
local n = #KEYS / 3
local ours = {}
for i = 1, n do
  local owner = redis.call('GET', KEYS[3 * i - 2])
  if owner then
    if owner ~= ARGV[1] and owner ~= ARGV[1] .. '+' then
      local ttl = redis.call('PTTL', KEYS[3 * i - 2])
      if ttl < 0 then
        -- Set without an expiry by someone else: report our own lease.
        ttl = tonumber(ARGV[2])
      end
      return {0, i, ttl}
    end
    -- Ours already: an earlier copy of this call ran and its reply was lost.
    ours[i] = true
  end
end
-- Counters left by an earlier version are folded into their slot counters
-- first (as acquire.lua's next_fence), so no token repeats.
for i = 1, n do
  local legacy = redis.call('GET', KEYS[3 * i])
  if legacy then
    local counter = KEYS[3 * i - 1]
    if tonumber(redis.call('GET', counter) or '0') < tonumber(legacy) then
      redis.call('SET', counter, legacy)
    end
    redis.call('DEL', KEYS[3 * i])
  end
end
local fences = {}
local answer = {1}
for i = 1, n do
  local counter = KEYS[3 * i - 1]
  if not fences[counter] then
    fences[counter] = redis.call('INCR', counter)
  end
  if ours[i] then
    -- Keep the value (and its '+' mark, if somebody queued behind us).
    redis.call('PEXPIRE', KEYS[3 * i - 2], ARGV[2])
  else
    redis.call('SET', KEYS[3 * i - 2], ARGV[1], 'PX', ARGV[2])
  end
  answer[i + 1] = fences[counter]
end
return answer
