-- leave.lua: remove a connection of a tab from the session's presence.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  connection id
-- ARGV[3]  tab id
-- ARGV[4]  the number ordering this write among the connection's (lease.Presence.Leave), 0 for none
-- ARGV[5]  the presence TTL in milliseconds: how long a mark is kept
-- ARGV[6]  the most marks the session keeps (lease.MaxPresence)
-- Answers {now}. Leaving a connection that is not listed changes nothing, but for its mark: with
-- ARGV[4] above the number recorded for the connection (presence.lua), the connection is marked
-- with it when the presence list holds an entry; with ARGV[4] not above it, nothing changes.
-- Without ARGV[4], a removed entry's number, if it had one, becomes its mark.
--
-- Events: what settle announces; then "left" (no reason) when the connection was the tab's last.

-- Validate.
local conn, tab = ARGV[2], ARGV[3]
local seq = arg_int(4, 0, MAX_EPOCH)
local ttl_ms = arg_int(5, 1, MAX_EPOCH)
local max_marks = arg_int(6, 1, MAX_EPOCH)
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
-- KEYS[4] holds a member exactly while KEYS[3] does (presence.lua).
local old = rcall('HGET', KEY_TABINFO, member)
if not old and seq == 0 then
  return finish(s, now, {now})
end
local recorded = old and (cjson.decode(old).s or 0) + 0 or
  mark_seq(rcall('HGET', KEY_TABINFO, member .. '/'), now)
if seq > 0 and seq <= recorded then
  return finish(s, now, {now}) -- a later write is applied already
end
if (seq > 0 and rcall('EXISTS', KEY_TABS) == 1) or (old and recorded > 0) then
  put_mark(member, mmax(seq, recorded), now, ttl_ms, max_marks)
end
if not old then
  return finish(s, now, {now})
end
local before = entries()
local listed = tab_of(before, tab)

-- Write state.
rcall('ZREM', KEY_TABS, member)
tabs_first = nil
rcall('HDEL', KEY_TABINFO, member)

-- Append event.
local still = false
for _, e in lipairs(before) do
  if e.tab == tab and e.member ~= member then
    still = true
  end
end
if not still then
  emit({type = 'left', tab = tab_json(listed), at = int(now)})
end
return finish(s, now, {now})
