-- get.lua: read the lease of a session at the store's time. It writes nothing.
-- KEYS[1]  the state hash of the session (see state.lua)
-- ARGV     none
-- Answers "OK" and the lease; a session that never had a lease is free at epoch 0.
local now = now_us()
return reply('OK', load(KEYS[1]), now)
