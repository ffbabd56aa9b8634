-- Draws the next operation number from the run's budget, and counts the
-- draws within the budget per worker: a process killed while a draw's
-- answer was on its way (possible when it runs several tasks) has then
-- drawn an operation that no log shows begin, and the checker can tell
-- which worker drew it instead of losing it.
-- KEYS[1] the operation counter, KEYS[2] draws per worker (hash)
-- ARGV[1] worker, ARGV[2] the budget
-- Returns the operation number (above the budget: the run is over).
local n = redis.call('INCR', KEYS[1])
if n <= tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
end
return n
