-- The plain release where the server has no compare-and-delete of its own
-- (DELIFEQ): delete the lock if its value is exactly our token.
-- KEYS[1] lock key; ARGV[1] owner token
-- Returns 1 when deleted, else 0: absent, another owner's, or ours but
-- marked (somebody queued: release.lua hands it over).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
