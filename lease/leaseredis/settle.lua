-- settle.lua: announce what of a session expired and was not announced yet, and keep its event
-- log (keep_log in events.lua); the engine's timer runs it for the sessions it has watchers for,
-- at their next deadline and at least every tenth of the log's TTL.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1..7]  the common arguments (see state.lua)
-- Answers {now, next, lost}: the store time, the session's next deadline in µs (0: none), and 1
-- when the log was missing, 0 otherwise. A watched session's log is kept by its watch and by this
-- script at least every tenth of its TTL, so a missing one is a store that lost data without
-- dropping a connection (FLUSHALL, a replica promoted without it): what its watchers were told may
-- be gone, and the engine starts them over from a snapshot.
--
-- Events: what settle announces (at most one "expired" per epoch, and "left" for the tabs whose
-- last presence entry expired), whichever instance runs it first.

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)
flush(s, now)
local lost = keep_log(s, now)

return {now, deadline(s, now), lost and 1 or 0}
