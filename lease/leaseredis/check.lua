-- check.lua: confirm that a tab holds the lease at an epoch. It writes nothing.
-- KEYS[1]  the state hash of the session (see state.lua)
-- ARGV[1]  tab id
-- ARGV[2]  epoch
-- Answers "OK" and the lease when the tab holds it at that epoch, "LOST" and the lease otherwise.
local key = KEYS[1]
local tab = ARGV[1]
local epoch = arg_int(2, 1, MAX_EPOCH)

local now = now_us()
local s = load(key)
if held_by(s, now, tab, epoch) then
  return reply('OK', s, now)
end
return reply('LOST', s, now)
