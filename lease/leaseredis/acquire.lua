-- acquire.lua: grant the lease of a session to a tab.
-- KEYS[1..4]  the keys of the session (see state.lua)
-- ARGV[1..2]  the event log's options (see state.lua)
-- ARGV[3]  tab id
-- ARGV[4]  label
-- ARGV[5]  "1" when the tab is hidden, "0" when visible
-- ARGV[6]  TTL in milliseconds, already clamped
-- ARGV[7]  mode: "try" or "takeover"
-- Answers "OK" and the lease granted; "HELD" and the lease of another tab when the mode is try;
-- "EXHAUSTED" when the next epoch would reach 2^53.
--
-- The holder acquiring again, in either mode, keeps its epoch and gets its lease extended: so a
-- retried call (go-redis resends a command whose answer was lost) never mints a second epoch.
-- Every other grant (free, expired, released, or a takeover) gets max(last+1, now_us).
--
-- Events: what settle announces; then "granted" for a grant of a free session, "taken_over" for a
-- takeover of another tab's lease, "updated" when the holder changed its label or hidden flag, and
-- nothing otherwise (a refused acquire included).

-- Validate.
local tab, label = ARGV[3], ARGV[4]
local hidden = ARGV[5] == '1'
local ttl_ms = arg_int(6, 1, MAX_EPOCH)
local mode = ARGV[7]
if mode ~= 'try' and mode ~= 'takeover' then
  error('tablease: ARGV[7] is not a mode')
end

-- Settle expiry.
local now = now_us()
local s = load()
settle(s, now)

-- Decide.
local expires = now + ttl_ms * 1000
local previous = nil -- the holder taken over
if held(s, now) then
  if s.tab == tab then
    -- The holder again: extend, and record the label and flag.
    local changed = s.label ~= label or s.hidden ~= hidden
    if expires < s.expires_us then
      deadline_earlier()
    end
    redis.call('HSET', KEY_STATE, 'label', label, 'hidden', hidden and '1' or '0',
      'expires_us', int(expires), 'ttl_ms', int(ttl_ms))
    s.label, s.hidden, s.expires_us, s.ttl_ms = label, hidden, expires, ttl_ms
    if changed then
      emit(lease_event('updated', s, now))
    end
    return finish(s, now, reply('OK', s, now))
  end
  if mode ~= 'takeover' then
    return finish(s, now, reply('HELD', s, now))
  end
  previous = {tab = s.tab, epoch = int(s.epoch)}
end
local epoch = math.max(s.epoch + 1, now)
if epoch >= MAX_EPOCH then
  return finish(s, now, reply('EXHAUSTED', s, now))
end

-- Write state.
s.tab, s.label, s.hidden = tab, label, hidden
s.epoch, s.granted_us, s.expires_us, s.ttl_ms = epoch, now, expires, ttl_ms
s.transitions = s.transitions + 1
redis.call('HSET', KEY_STATE, 'tab', tab, 'label', label, 'hidden', hidden and '1' or '0',
  'epoch', int(epoch), 'granted_us', int(now), 'expires_us', int(expires), 'ttl_ms', int(ttl_ms),
  'transitions', int(s.transitions))
redis.call('HDEL', KEY_STATE, 'rel_tab', 'rel_epoch')

-- Append event.
local ev = lease_event('granted', s, now)
if previous ~= nil then
  ev.type, ev.prev = 'taken_over', previous
end
emit(ev)
return finish(s, now, reply('OK', s, now))
