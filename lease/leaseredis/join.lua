-- join.lua: list a connection of a tab as present, or refresh it.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  connection id
-- ARGV[3]  tab id
-- ARGV[4]  label
-- ARGV[5]  "1" when the tab is hidden, "0" when visible
-- ARGV[6]  the presence TTL in milliseconds
-- ARGV[7]  the most connections the session's presence list may hold (lease.MaxPresence)
-- ARGV[8]  the number ordering this write among the connection's (lease.Presence.Join), 0 for none
-- Answers {"OK", now}: the entry lives until now + TTL; the connection keeps the time it first
-- joined. Answers {"FULL", now} and changes nothing when the session has no state and the user is
-- at the limit of sessions (admit in admin.lua); {"TABS_FULL", now} and changes nothing when the
-- connection is not listed and the list holds ARGV[7] live connections (settle dropped the
-- others) already. Answers {"OK", now} and changes nothing when ARGV[8] is not above the number
-- recorded for the connection (its entry's, or its mark's: presence.lua).
--
-- Events: what settle announces; then "joined" when the tab was not listed, "changed" when it was,
-- with another label or hidden flag than this join's (a tab is listed with those of its latest
-- refresh), nothing otherwise.

-- Validate.
local conn, tab, label = ARGV[2], ARGV[3], ARGV[4]
local hidden = ARGV[5] == '1' and '1' or '0'
local ttl_ms = arg_int(6, 1, MAX_EPOCH)
local max_conns = arg_int(7, 1, MAX_EPOCH)
local seq = arg_int(8, 0, MAX_EPOCH)
if conn == '' or tab == '' or string.find(conn, '/', 1, true) or string.find(tab, '/', 1, true) then
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
if not admit(s, now) then
  return finish(s, now, {'FULL', now})
end
local member = tab .. '/' .. conn
-- The connection's own entry, live since settle removed the expired ones (KEYS[4] holds a member
-- exactly while KEYS[3] does: every script writes both): a refresh lists its tab without reading
-- the other entries, and finds the number recorded for it in the entry. A new entry takes over
-- the connection's mark, if any.
local connected = now
local old = rcall('HGET', KEY_TABINFO, member)
local o = old and cjson.decode(old)
local mark = not o and rcall('HGET', KEY_TABINFO, member .. '/')
local recorded = o and (o.s or 0) + 0 or mark_seq(mark, now)
if seq > 0 and seq <= recorded then
  return finish(s, now, {'OK', now}) -- a later write is applied already
end
local before -- the tab as listed before this join, read only when it may have changed
if not o and rcall('ZCARD', KEY_TABS) >= max_conns then
  return finish(s, now, {'TABS_FULL', now})
end
if o then
  connected = tonumber(o.c) or now
  if o.l ~= label or o.h ~= hidden then
    before = tab_of(entries(), tab)
  end
else
  before = tab_of(entries(), tab)
end
local listed = old ~= false or before ~= nil

-- Write state.
seq = mmax(seq, recorded)
rcall('HSET', KEY_TABINFO, member, jencode({l = label, h = hidden, c = int(connected),
  r = int(now), s = seq > 0 and int(seq) or nil}))
if mark then
  rcall('HDEL', KEY_TABINFO, member .. '/')
end
rcall('ZADD', KEY_TABS, int(now + ttl_ms * 1000), member)
tabs_first = nil
rcall('PEXPIRE', KEY_TABS, int(ttl_ms + LOG_TTL_MS))
rcall('PEXPIRE', KEY_TABINFO, int(ttl_ms + LOG_TTL_MS))

-- Append event.
if not listed then
  emit({type = 'joined', tab = {id = tab, label = label, hidden = hidden == '1',
    connected = int(connected)}, at = int(now)})
elseif before ~= nil then
  local after = tab_of(entries(), tab)
  if after.label ~= before.label or after.hidden ~= before.hidden then
    emit({type = 'changed', tab = tab_json(after), at = int(now)})
  end
end
return finish(s, now, {'OK', now})
