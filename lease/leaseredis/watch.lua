-- watch.lua: the step that starts a watch: the lease, the tabs and the position of the log, and
-- the events after the caller's last one when the log still holds them all.
-- KEYS[1..7]  the keys of the session and of its user (see state.lua)
-- ARGV[1..7]  the common arguments (see state.lua)
-- ARGV[8]  the id of the last event the caller has seen ("<ms>-<seq>"), or ""
-- Answers {lease, position, resumed, replay, tabs, next}:
--   lease     the lease at the position (see reply in state.lua), status "OK"
--   position  the id of the log's newest event after settle, or "" when the log is empty
--   resumed   1 when ARGV[8] is neither before the log's oldest event nor after its newest
--   replay    when resumed, the events after ARGV[8] up to position: {id, json, id, json, …}
--   tabs      the tabs present: {tab, label, hidden (1|0), connected µs, …} (see tabs in presence.lua)
--   next      the session's next deadline in µs (0: none), for the engine's settle timer
--
-- Events: what settle announces, appended before the position is read.

-- Validate.
local after = ARGV[8]
if after ~= '' and parse_id(after) == nil then
  error('tablease: ARGV[8] is not an event id')
end

-- Settle expiry.
local now = now_us()
local s = load()
settle(s, now)
flush(s, now)

-- Read the log, the lease and the tabs.
local position = last_entry_id()
local resumed, replay = 0, {}
if after ~= '' and position ~= '' then
  local first = redis.call('XRANGE', KEY_EVENTS, '-', '+', 'COUNT', 1)
  if first[1] and compare_ids(after, first[1][1]) >= 0 and compare_ids(after, position) <= 0 then
    resumed = 1
    for _, entry in ipairs(redis.call('XRANGE', KEY_EVENTS, '(' .. after, '+')) do
      local fields = entry[2]
      local json = ''
      for i = 1, #fields, 2 do
        if fields[i] == 'e' then
          json = fields[i + 1]
        end
      end
      replay[#replay + 1] = entry[1]
      replay[#replay + 1] = json
    end
  end
end
local listed = tabs_reply(entries())
return {reply('OK', s, now), position, resumed, replay, listed, deadline(s, now)}
