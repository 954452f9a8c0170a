-- release.lua: end the lease held by a tab at an epoch.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  tab id
-- ARGV[3]  epoch, or "gone" when the tab is gone for good (lease.ReleaseRequest.Gone)
-- ARGV[4]  with "gone": the window in milliseconds for which the tab's acquires are refused
-- ARGV[5]  with "gone": how many gone tabs the session remembers at once (lease.MaxGone)
-- Answers "RELEASED" and the free lease when the tab held it at that epoch, and also when the
-- lease is still free since a release of that tab and epoch ended it (a retry); "KEPT" and the
-- lease as it is otherwise: a stale release never touches a newer lease; "FULL" (below).
--
-- A gone tab's release ends the lease the tab holds at whatever epoch, and marks the tab gone
-- (the field gone in state.lua, which keeps the latest lease.MaxGone) so that acquire.lua refuses
-- its acquires until the end of the window: one it sent before it went, arriving after this call,
-- grants nothing. It also ends the handoff the tab asked for, request or reservation
-- (clear_handoff), so that the holder's release reserves nothing for it. A session with no state
-- is given one for the mark, unless the user is at the limit of sessions (admit in admin.lua): it
-- then answers "FULL" and the free lease, changing nothing.
--
-- When this call ends the lease while a handoff request is pending (lease.ModeHandoff), the free
-- lease is reserved for the requester until now plus the request's reserve window
-- (reserve_handoff in events.lua); a request that lapsed is deleted.
--
-- Events: what settle announces; then "released" (with the requester when it reserved the lease)
-- when this call ended the lease, nothing otherwise (a retry included). Audit: "release" when this
-- call ended the lease, which also takes the session out of the user's index of held leases.

-- Validate.
local tab = ARGV[2]
local gone = ARGV[3] == 'gone'
local epoch = gone and 0 or arg_int(3, 1, MAX_EPOCH)
local gone_ms = gone and arg_int(4, 1, MAX_EPOCH) or 0
local GONE_MAX = gone and arg_int(5, 1, 1000) or 0

-- Answer a retry of this call as it was answered (see state.lua).
local replay = replayed()
if replay then
  return replay
end

-- Settle expiry.
local now = now_us()
local s = load(now, true) -- a release is most often of a held lease, in its hash
settle(s, now)

-- Mark a gone tab, and release whatever epoch it holds.
if gone then
  if not admit(s, now) then
    return finish(s, now, reply('FULL', s, now))
  end
  local until_us = now + gone_ms * 1000
  s.keep_us = mmax(s.keep_us, until_us)
  state_set('gone', gone_with(now, tab_mark(tab), until_us, GONE_MAX), 'keep_us', int(s.keep_us))
  if s.ho_tab == tab then
    clear_handoff(s) -- a closed tab is handed nothing
  end
  if s.tab == tab then
    epoch = s.epoch
  elseif released_by(s, tab, s.rel_epoch) then
    epoch = s.rel_epoch -- a retry: answered as the release that ended the tab's lease
  end
end

-- Decide.
if not held_by(s, now, tab, epoch) then
  local retried = not held(s, now) and released_by(s, tab, epoch)
  return finish(s, now, reply(retried and 'RELEASED' or 'KEPT', s, now))
end

-- Write state: the end of this epoch is announced here, so it is marked ended. A session that
-- is then parkable is parked (flush), and its hash, deleted, is not written first.
local requester = reserve_handoff(s, now)
s.expires_us, s.rel_tab, s.rel_epoch, s.ended_epoch = now, tab_mark(tab), epoch, epoch
s.tab = ''
parking = parkable(s, now) and keep_until(s, now, true) ~= nil
state_set('expires_us', int(now), 'rel_tab', s.rel_tab, 'rel_epoch', int(epoch),
  'ended_epoch', int(epoch))
drop_holder(s)
index_remove()

-- Append event and audit record.
emit({type = 'released', epoch = int(epoch), prev = {tab = tab, epoch = int(epoch)},
  requester = requester, at = int(now)})
record('release', epoch, now, 'tab', tab) -- its holder before: tab at e (admin.lua)
return finish(s, now, reply('RELEASED', s, now))
