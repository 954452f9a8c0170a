-- tabs.lua: list the tabs present in a session.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- Answers {tab, label, hidden (1|0), connected µs, …}, in the order they connected, then by tab id.
--
-- Events: what settle announces.

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)

local listed = tabs_reply(entries())
return finish(s, now, listed)
