-- change_many.lua: several calls of the functions that change a session and keep their answers
-- (acquire, release, join, leave) in one call, each made as it is alone. The engine sends the
-- changes of concurrent calls so (batch.go): a function call costs Redis its own work (the
-- command, entering Lua) and TIME whatever it does, which the calls made together share.
-- KEYS[9i-8..9i]  the keys of call i (see state.lua), its reply key included. On a Cluster, all in
--                 one slot (the engine sends the changes of one user together there).
-- ARGV[1]         the common arguments (see state.lua)
-- then, for each call in turn: the name of its function, the count n of its own arguments, and
-- those n arguments (its ARGV[2..n+1]).
-- Answers a list with an entry per call, in their order: what its function answers alone, or the
-- error it raises, as an error reply; what a call wrote before its error stays written, as when
-- it is made alone, and the next calls are made all the same. The store clock is read once, for
-- all of them (CALLS_NOW in state.lua).
local n = #keys / 9
if n < 1 or n % 1 ~= 0 then
  error('tablease: change_many takes nine keys per call')
end
-- Check every call's function and arguments before making any.
local calls, a = {}, 2
for i = 1, n do
  local f, count = CALLS[argv[a]], tonumber(argv[a + 1])
  if f == nil or count == nil or count % 1 ~= 0 or count < 0 or a + 1 + count > #argv then
    error('tablease: change_many call ' .. i .. ' is not a function and its arguments')
  end
  calls[i] = {f, a + 2, a + 1 + count}
  a = a + 2 + count
end
if a ~= #argv + 1 then
  error('tablease: change_many has arguments after its last call')
end
CALLS_NOW = now_us()
local out = {}
for i = 1, n do
  local c = calls[i]
  local k = 9 * i - 9
  local ok, r = pcall(c[1], {keys[k + 1], keys[k + 2], keys[k + 3], keys[k + 4], keys[k + 5],
    keys[k + 6], keys[k + 7], keys[k + 8], keys[k + 9]}, {argv[1], unpack(argv, c[2], c[3])})
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r -- the error of a command (redis.call)
  else
    out[i] = {err = 'ERR ' .. (type(r) == 'string' and r or 'the call failed')}
  end
end
return out
