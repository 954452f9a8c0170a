-- settle.lua: announce what of a session expired and was not announced yet; the engine's timer
-- runs it for the sessions it has watchers for, at their next deadline.
-- KEYS[1..7]  the keys of the session and of its user (see state.lua)
-- ARGV[1..7]  the common arguments (see state.lua)
-- Answers {now, next}: the store time and the session's next deadline in µs (0: none).
--
-- Events: what settle announces (at most one "expired" per epoch, and "left" for the tabs whose
-- last presence entry expired), whichever instance runs it first.

-- Settle expiry.
local now = now_us()
local s = load()
settle(s, now)
flush(s, now)

return {now, deadline(s, now)}
