-- acquire.lua: grant the lease of a session to a tab, or ask its holder to hand it over.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  tab id
-- ARGV[3]  label
-- ARGV[4]  "1" when the tab is hidden, "0" when visible
-- ARGV[5]  TTL in milliseconds, already clamped
-- ARGV[6]  mode: "try", "takeover" or "handoff"
-- ARGV[7]  the handoff timeout in milliseconds: how long a handoff request made now is pending
-- ARGV[8]  the handoff reserve window in milliseconds, stored with a request made now (see state.lua)
-- ARGV[9]  "1" when the holder's own acquire asks for a new epoch (lease.AcquireRequest.NewEpoch);
--          left out otherwise
-- Answers "OK" and the lease granted; "HELD" and the lease of another tab when the mode is try;
-- "PENDING" and the lease, with the end of the handoff as until_us, when a handoff is requested
-- or the lease is reserved for another tab (lease.ModeHandoff, below); "BLOCKED" and the free
-- lease, with the end of the block as until_us, while an admin's block lasts (block_until_us, see
-- revoke.lua), in every mode and for every tab; "EXHAUSTED" when the next epoch would reach 2^53;
-- "FULL" and the free lease, changing nothing, when the session has no state and the user is at
-- the limit of sessions (admit in admin.lua); "GONE" and the lease, with the end of the tab's
-- window as until_us, changing nothing, while the tab is marked gone (release.lua).
--
-- Epochs: see lease.Engine.Acquire and lease.NextEpoch (the holder's own acquire keeps its epoch
-- unless ARGV[9] asks for a new one; a call go-redis resends after losing its answer is answered
-- from KEYS[9] and changes nothing).
--
-- Handoff: see lease.ModeHandoff. After the holder's own acquire, this script checks, for a lease
-- another tab holds: in mode handoff, a request pending (pending_handoff) answers "PENDING" and
-- changes nothing, else a new request (the ho_* fields, see state.lua) is written until now +
-- ARGV[7]; mode try is "HELD", mode takeover takes over. For a free lease that is reserved
-- (reservation): its requester's acquire, in any mode, claims it; another tab's in mode try or
-- handoff is "PENDING". Every grant deletes the handoff fields (clear_handoff), whatever they held.
--
-- Events: what settle announces, then those lease.Feed lists for Acquire. Audit: "grant" for a
-- grant of a free session, "grant" with ptab and pep for a new epoch of the holder (its old one),
-- "handoff" for the grant that claims a reservation (ptab and pep: the tab that handed the lease
-- over), "takeover" for a takeover, nothing otherwise.
-- Index: every "OK" lists the session in the user's index of held leases (a no-op unless it is a
-- grant). The engine adds the user to the prefix's users index before it runs this script, unless
-- it knows the user is there (see "Skipping the adds" in admin.go).

-- Validate.
local tab, label = ARGV[2], ARGV[3]
local hidden = ARGV[4] == '1'
local ttl_ms = arg_int(5, 1, MAX_EPOCH)
local mode = ARGV[6]
if mode ~= 'try' and mode ~= 'takeover' and mode ~= 'handoff' then
  error('tablease: ARGV[6] is not a mode')
end
local handoff_timeout_ms = arg_int(7, 1, MAX_EPOCH)
local handoff_reserve_ms = arg_int(8, 1, MAX_EPOCH)
local new_epoch = ARGV[9] == '1'

-- Answer a retry of this call as it was answered (see state.lua).
local replay = replayed()
if replay then
  return replay
end

-- Settle expiry.
local now = now_us()
local s = load(now)
settle(s, now)

-- Refuse a tab that said it is gone (release.lua), in every mode. The mark is read only while a
-- window is open (keep_us, see state.lua).
local gone_until = s.keep_us > now and gone_window(tab_mark(tab), now)
if gone_until then
  return finish(s, now, reply('GONE', s, now, gone_until))
end

-- Refuse a session the user has no state for when the user is at the limit of sessions.
if not admit(s, now) then
  return finish(s, now, reply('FULL', s, now))
end

-- Refuse while blocked: a blocked session is always free (the revoke that blocked it ended it).
if s.block_until_us > now then
  return finish(s, now, reply('BLOCKED', s, now, s.block_until_us))
end

-- Decide.
local expires = now + ttl_ms * 1000
local previous = nil -- the holder taken over: {tab, epoch}
local former = nil -- the holder at its former epoch, when it asked for a new one: {tab, epoch}
if new_epoch and s.tab == tab and held(s, now) then
  former = {tab = tab, epoch = s.epoch}
elseif held(s, now) then
  if s.tab == tab then
    -- The holder again: extend, and record the label and flag.
    local changed = s.label ~= label or s.hidden ~= hidden
    if expires < s.expires_us then
      deadline_earlier()
    end
    state_set('label', label, 'hidden', hidden and '1' or '0',
      'expires_us', int(expires), 'ttl_ms', int(ttl_ms))
    s.label, s.hidden, s.expires_us, s.ttl_ms = label, hidden, expires, ttl_ms
    index_add()
    if changed then
      emit(lease_event('updated', s, now))
    end
    return finish(s, now, reply('OK', s, now))
  end
  if mode == 'handoff' then
    if pending_handoff(s, now) then
      return finish(s, now, reply('PENDING', s, now, s.ho_until_us))
    end
    -- Write state: a new request, replacing whatever lapsed.
    s.ho_tab, s.ho_label, s.ho_hidden = tab, label, hidden
    s.ho_from_tab, s.ho_from_epoch = s.tab, s.epoch
    s.ho_until_us, s.ho_reserved, s.ho_reserve_ms = now + handoff_timeout_ms * 1000, false,
      handoff_reserve_ms
    state_set('ho_tab', tab, 'ho_label', label,
      'ho_hidden', hidden and '1' or '0', 'ho_from_tab', s.tab, 'ho_from_epoch', int(s.epoch), 'ho_until_us', int(s.ho_until_us),
      'ho_reserved', '0', 'ho_reserve_ms', int(handoff_reserve_ms))
    local ev = lease_event('handoff_requested', s, now)
    ev.requester = {tab = tab, label = label, hidden = hidden}
    emit(ev)
    return finish(s, now, reply('PENDING', s, now, s.ho_until_us))
  end
  if mode ~= 'takeover' then
    return finish(s, now, reply('HELD', s, now))
  end
  previous = {tab = s.tab, epoch = s.epoch}
end
local handed_by = nil -- the tab that handed the lease over, when this grant claims its reservation
if reservation(s, now) then
  if s.ho_tab == tab then
    handed_by = {tab = s.ho_from_tab, epoch = s.ho_from_epoch}
  elseif mode ~= 'takeover' then
    return finish(s, now, reply('PENDING', s, now, s.ho_until_us))
  end
end
local epoch = mmax(s.epoch + 1, now)
if epoch >= MAX_EPOCH then
  return finish(s, now, reply('EXHAUSTED', s, now))
end

-- Write state.
s.tab, s.label, s.hidden = tab, label, hidden
s.epoch, s.granted_us, s.expires_us, s.ttl_ms = epoch, now, expires, ttl_ms
s.transitions = s.transitions + 1
if s.parked then
  -- The grant writes the whole state of a parked session, with the end of its last epoch, so that
  -- flush moves it to the hash by deleting its field alone (unpark): the event_id is append's.
  state_set('tab', tab, 'label', label, 'hidden', hidden and '1' or '0',
    'epoch', int(epoch), 'granted_us', int(now), 'expires_us', int(expires), 'ttl_ms', int(ttl_ms),
    'transitions', int(s.transitions), 'ended_epoch', int(s.ended_epoch))
  s.whole = true
else
  state_set('tab', tab, 'label', label, 'hidden', hidden and '1' or '0',
    'epoch', int(epoch), 'granted_us', int(now), 'expires_us', int(expires), 'ttl_ms', int(ttl_ms),
    'transitions', int(s.transitions))
end
if s.rel_tab ~= '' then
  if not s.parked then
    rcall('HDEL', KEY_STATE, 'rel_tab', 'rel_epoch')
  end
  s.rel_tab, s.rel_epoch = '', 0
end
clear_handoff(s) -- a new grant ends every handoff in progress
index_add()

-- Append event and audit record.
local ev = lease_event('granted', s, now)
if previous ~= nil then
  ev.type, ev.prev = 'taken_over', {tab = previous.tab, epoch = int(previous.epoch)}
  record('takeover', epoch, now, 'tab', tab, 'ptab', previous.tab, 'pep', int(previous.epoch))
elseif handed_by ~= nil then
  ev.prev, ev.reason = {tab = handed_by.tab, epoch = int(handed_by.epoch)}, 'handoff'
  record('handoff', epoch, now, 'tab', tab, 'ptab', handed_by.tab, 'pep', int(handed_by.epoch))
elseif former ~= nil then
  ev.prev, ev.reason = {tab = former.tab, epoch = int(former.epoch)}, 'new_epoch'
  record('grant', epoch, now, 'tab', tab, 'ptab', former.tab, 'pep', int(former.epoch))
else
  record('grant', epoch, now, 'tab', tab)
end
emit(ev)
return finish(s, now, reply('OK', s, now))
