-- settle.lua: announce what of a session expired and was not announced yet, and keep its event
-- log (keep_log in events.lua); the engine's timer runs it for the sessions it has watchers for,
-- at their next deadline and at least every tenth of the log's TTL.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1..7]  the common arguments (see state.lua)
-- Answers {now, next}: the store time and the session's next deadline in µs (0: none).
--
-- Events: what settle announces (at most one "expired" per epoch, and "left" for the tabs whose
-- last presence entry expired), whichever instance runs it first.

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)
flush(s, now)
keep_log(s, now)

return {now, deadline(s, now)}
