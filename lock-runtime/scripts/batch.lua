-- Several lock calls in one script call (group commit): each op runs the
-- per-key script it names on its own slice of KEYS and ARGV, one after the
-- other in the order they were queued. The library composes this text after
-- acquire.lua, release.lua and extend.lua, each wrapped unchanged as
-- `local function <name>(KEYS, ARGV) <text> end`, so every op is exactly its
-- own script, and the whole call is one atomic step.
-- Only a mutex's calls are batched (four keys for acquire and release, one
-- for extend); a leader election's, which pass more keys, are sent alone.
-- ARGV[1] the number of ops; then for each op: 'a' (acquire), 'r' (release)
-- or 'e' (extend), its number of keys, its number of arguments, and those
-- arguments. KEYS: the ops' keys, one op's after the other's.
-- Returns one answer per op, in order: what its script returns, or, when
-- the op failed (a key of the wrong type, say), the string 'ERR ' followed
-- by the error (no script answers a plain string). A failing op does not
-- stop the others; what it wrote before failing stays, as it would were its
-- script called on its own.
local ops = {a = acquire, r = release, e = extend}
local out = {}
local k, a = 0, 1
for i = 1, tonumber(ARGV[1]) do
  local run = ops[ARGV[a + 1]]
  local nk, na = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 3
  local keys, argv = {}, {}
  for j = 1, nk do
    keys[j] = KEYS[k + j]
  end
  for j = 1, na do
    argv[j] = ARGV[a + j]
  end
  k = k + nk
  a = a + na
  local ok, answer = pcall(run, keys, argv)
  if ok then
    out[i] = answer
  elseif type(answer) == 'table' and answer.err then
    out[i] = 'ERR ' .. answer.err
  else
    out[i] = 'ERR ' .. tostring(answer)
  end
end
return out
