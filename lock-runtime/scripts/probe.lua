-- Which native commands the server has, asked once per client when it
-- connects (a script, so a least-privilege ACL user needs no `COMMAND` or
-- `INFO`: the scripts' `EVALSHA` is enough).
-- Returns 1 when the server has `DELIFEQ` and `SET .. IFEQ` (Valkey 9.0 and
-- later, which names itself in the `server` table its scripts see), 2 when
-- it has `DELEX .. IFEQ` and `SET .. IFEQ` (Redis 8.4 and later), else 0.
-- `rawget`: Redis refuses a script that reads a global it does not have.
local server = rawget(_G, 'server')
if server and server.SERVER_NAME == 'valkey' then
  if (server.VALKEY_VERSION_NUM or 0) >= 0x090000 then
    return 1
  end
  return 0
end
if (redis.REDIS_VERSION_NUM or 0) >= 0x080400 then
  return 2
end
return 0
