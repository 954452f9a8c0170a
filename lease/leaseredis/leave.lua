-- leave.lua: remove a connection of a tab from the session's presence.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  connection id
-- ARGV[3]  tab id
-- Answers {now}. Leaving a connection that is not listed changes nothing.
--
-- Events: what settle announces; then "left" (no reason) when the connection was the tab's last.

-- Validate.
local conn, tab = ARGV[2], ARGV[3]
if conn == '' or tab == '' then
  error('tablease: ARGV[2] and ARGV[3] must be identifiers')
end

-- Answer a retry of this call as it was answered (see state.lua).
local replay = replayed()
if replay then
  return replay
end

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)

-- Decide.
local member = tab .. '/' .. conn
if not redis.call('ZSCORE', KEY_TABS, member) then
  return finish(s, now, {now})
end
local before = entries()
local listed = tab_of(before, tab)

-- Write state.
redis.call('ZREM', KEY_TABS, member)
tabs_first = nil
redis.call('HDEL', KEY_TABINFO, member)

-- Append event.
local still = false
for _, e in ipairs(before) do
  if e.tab == tab and e.member ~= member then
    still = true
  end
end
if not still then
  emit({type = 'left', tab = tab_json(listed), at = int(now)})
end
return finish(s, now, {now})
