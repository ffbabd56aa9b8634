-- Which native commands the server has, asked once per client when it
-- connects (a script, so a least-privilege ACL user needs no `COMMAND` or
-- `INFO`: the scripts' `EVALSHA` is enough).
-- Returns 1 when the server has `DELIFEQ` (Valkey 9.0 and later, which
-- names itself in the `server` table its scripts see), else 0.
if server and server.SERVER_NAME == 'valkey' and (server.VALKEY_VERSION_NUM or 0) >= 0x090000 then
  return 1
end
return 0
