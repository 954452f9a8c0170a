-- get.lua: read the lease of a session at the store's time. It writes nothing but what settle
-- announces.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- Answers "OK" and the lease; a session that never had a lease is free at epoch 0.

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)

return finish(s, now, reply('OK', s, now))
