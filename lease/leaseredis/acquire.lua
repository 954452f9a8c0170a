-- acquire.lua: grant the lease of a session to a tab.
-- KEYS[1..6]  the keys of the session and of its user (see state.lua)
-- ARGV[1..4]  the options of the logs (see state.lua)
-- ARGV[5]  tab id
-- ARGV[6]  label
-- ARGV[7]  "1" when the tab is hidden, "0" when visible
-- ARGV[8]  TTL in milliseconds, already clamped
-- ARGV[9]  mode: "try" or "takeover"
-- Answers "OK" and the lease granted; "HELD" and the lease of another tab when the mode is try;
-- "BLOCKED" and the free lease, with the end of the block as until_us, while an admin's block
-- lasts (block_until_us, see revoke.lua), in every mode and for every tab; "EXHAUSTED" when the
-- next epoch would reach 2^53.
--
-- The holder acquiring again, in either mode, keeps its epoch and gets its lease extended: so a
-- retried call (go-redis resends a command whose answer was lost) never mints a second epoch.
-- Every other grant (free, expired, released, or a takeover) gets max(last+1, now_us).
--
-- Events: what settle announces; then "granted" for a grant of a free session, "taken_over" for a
-- takeover of another tab's lease, "updated" when the holder changed its label or hidden flag, and
-- nothing otherwise (a refused acquire included).
-- Audit: "grant" for a grant of a free session, "takeover" for a takeover, nothing otherwise.
-- Index: every "OK" lists the session in the user's index of held leases (a no-op unless it is a
-- grant). The engine adds the user to the prefix's users index before it runs this script.

-- Validate.
local tab, label = ARGV[5], ARGV[6]
local hidden = ARGV[7] == '1'
local ttl_ms = arg_int(8, 1, MAX_EPOCH)
local mode = ARGV[9]
if mode ~= 'try' and mode ~= 'takeover' then
  error('tablease: ARGV[9] is not a mode')
end

-- Settle expiry.
local now = now_us()
local s = load()
settle(s, now)

-- Refuse while blocked: a blocked session is always free (the revoke that blocked it ended it).
if s.block_until_us > now then
  return finish(s, now, reply('BLOCKED', s, now, s.block_until_us))
end

-- Decide.
local expires = now + ttl_ms * 1000
local previous = nil -- the holder taken over: {tab, epoch}
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
    index_add()
    if changed then
      emit(lease_event('updated', s, now))
    end
    return finish(s, now, reply('OK', s, now))
  end
  if mode ~= 'takeover' then
    return finish(s, now, reply('HELD', s, now))
  end
  previous = {tab = s.tab, epoch = s.epoch}
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
index_add()

-- Append event and audit record.
local ev = lease_event('granted', s, now)
local rec = {a = 'grant', e = epoch, at = now, tab = tab}
if previous ~= nil then
  ev.type, ev.prev = 'taken_over', {tab = previous.tab, epoch = int(previous.epoch)}
  rec.a, rec.ptab, rec.pep = 'takeover', previous.tab, previous.epoch
end
emit(ev)
record(rec)
return finish(s, now, reply('OK', s, now))
