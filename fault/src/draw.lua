-- Draws the next operation number from the run's budget, and counts the
-- draws within the budget per worker: a process killed while a draw's
-- answer was on its way (possible when it runs several tasks) has then
-- drawn an operation that no log shows begin, and the checker can tell
-- which worker drew it instead of losing it.
-- KEYS[1] the operation counter, KEYS[2] draws per worker (hash), KEYS[3]
-- each worker's last draw, '<seq>:<number>' (hash)
-- ARGV[1] worker, ARGV[2] the budget, ARGV[3] the worker's draw sequence
-- number (1, 2, ...): a draw sent again after its reply was lost gets the
-- first one's number, so a timeout neither loses nor doubles a draw.
-- Returns the operation number (above the budget: the run is over).
local last = redis.call('HGET', KEYS[3], ARGV[1])
if last then
  local seq, drawn = string.match(last, '^(%d+):(%d+)$')
  if seq == ARGV[3] then
    return tonumber(drawn)
  end
end
local n = redis.call('INCR', KEYS[1])
if n <= tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3] .. ':' .. n)
return n
