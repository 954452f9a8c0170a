-- watch.lua: the step that starts a watch: the lease, the tabs and the position of the log, and
-- the events after the caller's last one when the log still holds them all.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  the id of the last event the caller has seen ("<ms>-<seq>"), or ""
-- Answers {lease} with the status "FULL", keeping no log, when the session has no state and the
-- user is at the limit of sessions (admit in admin.lua; a watched session counts, keep_log in
-- events.lua); otherwise {lease, position, resumed, replay, tabs, next}:
--   lease     the lease at the position (see reply in state.lua), status "OK"
--   position  the id of the log's newest event after settle, or "" when the log is empty
--   resumed   1 when ARGV[2] is the id of an event the log holds (so it holds every one after it)
--   replay    when resumed, the events after ARGV[2] up to position: {id, json, id, json, …}
--   tabs      the tabs present: {tab, label, hidden (1|0), connected µs, …} (see tabs in presence.lua)
--   next      the session's next deadline in µs (0: none), for the engine's settle timer
--
-- Events: what settle announces, appended before the position is read. The log is created when
-- missing and kept (keep_log in events.lua): the session is watched from now on.

-- Validate.
local after = ARGV[2]
if after ~= '' and parse_id(after) == nil then
  error('tablease: ARGV[2] is not an event id')
end

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)
flush(s, now)

-- Refuse a session the user has no state for when the user is at the limit of sessions.
if not admit(s, now) then
  return {reply('FULL', s, now)}
end
keep_log(s, now)

-- Read the log, the lease and the tabs.
local position = last_entry_id()
local resumed, replay = 0, {}
if after ~= '' and position ~= '' then
  local first = smatch(rcall('LINDEX', KEY_EVENTS, '0'), '^%S+')
  if compare_ids(after, first) >= 0 and compare_ids(after, position) <= 0 then
    -- The entries after ARGV[2] (the list is in the order of the ids), read from the newest back,
    -- in chunks that double, down to the first entry at or before ARGV[2], which must be ARGV[2]
    -- itself: an id the log never had is unknown. The log's mark, its oldest entry when it has
    -- one, is at or before ARGV[2] (first above), so it is never replayed.
    local found = compare_ids(after, position) == 0
    local newer, stop, size, done = {}, -1, 8, found
    while not done do
      local chunk = rcall('LRANGE', KEY_EVENTS, int(stop - size + 1), int(stop))
      for i = #chunk, 1, -1 do
        local id, json = smatch(chunk[i], '^(%S+) ?(.*)$')
        if compare_ids(id, after) <= 0 then
          found, done = compare_ids(id, after) == 0, true
          break
        end
        newer[#newer + 1] = id
        newer[#newer + 1] = json
      end
      done = done or #chunk < size
      stop, size = stop - size, size * 2
    end
    if found then
      resumed = 1
      for i = #newer - 1, 1, -2 do
        replay[#replay + 1] = newer[i]
        replay[#replay + 1] = newer[i + 1]
      end
    end
  end
end
local listed = tabs_reply(entries())
return {reply('OK', s, now), position, resumed, replay, listed, deadline(s, now)}
