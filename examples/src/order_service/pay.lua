-- Marks an order paid, unless a write with a newer fencing token was already
-- accepted for it (the payment then comes from a holder whose lease ran out).
-- KEYS[1]: the order (a hash). ARGV[1]: the fencing token of the payment's lock.
-- Returns 1: paid; 0: no such order; -1: refused, a newer token wrote first.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < fence then
  return -1
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'status', 'paid', 'paid_with_fencing_token', ARGV[1])
return 1
