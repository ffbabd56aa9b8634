-- Extend many leases in one call (the batched watchdog).
-- KEYS[i] lock key; ARGV[2i-1] owner token, ARGV[2i] lease in milliseconds
-- Returns a list: 1 where re-armed, 0 where absent, held by another owner,
-- or marked with a deadline that has passed. Each lease is re-armed as
-- extend.lua re-arms one (a marked value gets the new deadline and keeps
-- its pin: see acquire.lua).
local out = {}
local now
for i = 1, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  local token = ARGV[2 * i - 1]
  out[i] = 0
  if owner == token then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  elseif owner and string.sub(owner, 1, #token + 1) == token .. '+' then
    local ends = tonumber(string.sub(owner, #token + 2))
    if not ends then
      redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
      out[i] = 1
    else
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      if ends > now then
        local lease = tonumber(ARGV[2 * i])
        local keep = math.max(redis.call('PTTL', KEYS[i]), lease)
        redis.call('SET', KEYS[i], token .. '+' .. (now + lease), 'PX', keep)
        out[i] = 1
      end
    end
  end
end
return out
