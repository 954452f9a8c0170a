-- settle.lua: announce what of a session expired and was not announced yet, and keep its event
-- log (keep_log in events.lua); the engine's timer runs it for the sessions it has watchers for,
-- at their next deadline and at least every tenth of the log's TTL.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- Answers {now, next, newest}: the store time, the session's next deadline in µs (0: none), and
-- the id of the log's newest event ('' when it has none). Every event a watcher was sent was
-- appended to the log first, and the log is kept (recreated from the state's last event id when
-- it expired), so a newest event older than one a watcher had before this script ran is a store
-- that lost data without dropping a connection (FLUSHALL, a replica promoted without the writes):
-- the engine starts that watcher over from a snapshot (fire in feed.go).
--
-- Events: what settle announces (at most one "expired" per epoch, and "left" for the tabs whose
-- last presence entry expired), whichever instance runs it first.

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)
flush(s, now)
keep_log(s, now)

return {now, deadline(s, now), last_entry_id()}
