-- revoke.lua: an admin ends the lease of a session, whoever holds it, and may block grants.
-- KEYS[1..8]  the keys of the session and of its user (see state.lua)
-- KEYS[9]     where the answer of this call is kept for its retries (see state.lua)
-- KEYS[10]    the admins' audit log of the user (see state.lua and admin.lua)
-- KEYS[11]    where the answer of this revoke is kept for the retries of its request id, when it
--             has one (see state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  the admin's sub
-- ARGV[3]  the reason
-- ARGV[4]  the block in milliseconds; 0 leaves the session's block as it is
-- ARGV[5]  the request id, or "" for none
-- ARGV[6]  how long a revoke with a request id is remembered for its retries, in milliseconds
-- ARGV[7]  the id of the admin's request as its log lines name it, kept in the audit records
--          (rid), or "" for none (an engine before this argument sends none: nil reads as "")
-- Answers {status, revoked (1|0), epoch, until_us, previous tab, previous epoch, now_us}: status
-- "OK", or "RETRIED" for the retry of a revoke with the same request id, with that revoke's
-- answer; revoked 1 when this call ended a lease; the epoch it minted then, the last epoch
-- otherwise; until_us the end of the session's block when grants are blocked after the call, 0
-- when they are not; the holder revoked ("" and 0 when none). Status "EXHAUSTED" (and the rest as
-- for a free lease) when the epoch to mint would reach 2^53: nothing is revoked then.
--
-- In this order, in one step: settle; the retry of a revoke with a request id (same session, admin
-- and request id, within the window of ARGV[6]: KEYS[11] expires with it) answers what that
-- revoke answered and changes nothing, whatever revokes of the session came in between; a held
-- lease is revoked: a new epoch (lease.NextEpoch, as a grant mints it), no holder, granted_us =
-- expires_us = now, one more transition, and the epoch marked ended (ended_epoch) so that no
-- expiry is ever announced of it;
-- the handoff in progress, if any, ends (a request with the lease revoked, or the reservation of a
-- free lease), silently: clear_handoff deletes its fields whether or not a lease is revoked; a
-- positive block sets block_until_us to now + the block, replacing the old block whether it ends
-- earlier or later; a request id keeps the answer in KEYS[11] for the window.
--
-- Events: what settle announces; then "revoked" (the new epoch, no holder, the holder revoked as
-- prev, the reason) when a lease was revoked; nothing else (a revoke of a free lease, a block and a
-- retry are not events).
-- Audit: "revoke" when a lease was revoked, then "block" (with the session's epoch after the call)
-- for a positive block, whether or not a lease was revoked. A revoke takes the session out of the
-- user's index of held leases. The engine adds the user to the prefix's users index before it runs
-- this script, since its records are in the user's audit log, unless it knows the user is there
-- (see "Skipping the adds" in admin.go).

-- Validate.
local admin, reason = ARGV[2], ARGV[3]
local block_ms = arg_int(4, 0, MAX_EPOCH)
local request = ARGV[5]
local window_ms = arg_int(6, 0, MAX_EPOCH)
local rid = ARGV[7] or ''
local rid_field = rid ~= '' and {'rid', rid} or {} -- of its audit records: a field is never empty
if admin == '' or reason == '' then
  error('tablease: ARGV[2] and ARGV[3] must not be empty')
end
if (request ~= '') ~= (KEY_REVOKE ~= nil) then
  error('tablease: the key of the revoke\'s answer is given with a request id, and only then')
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

-- Answer a retry as the revoke it retries was answered.
if request ~= '' then
  local m = rcall('GET', KEY_REVOKE)
  if m then
    local a = cmsgpack.unpack(m) -- {revoked, epoch, until_us, previous tab, previous epoch}
    return finish(s, now, {'RETRIED', a[1], a[2], a[3], a[4], a[5], now})
  end
end

-- Decide.
local revoked = held(s, now)
local epoch, previous = s.epoch, nil -- the epoch after the call; the holder revoked: {tab, epoch}
if revoked then
  epoch = mmax(s.epoch + 1, now)
  if epoch >= MAX_EPOCH then
    return finish(s, now, {'EXHAUSTED', 0, s.epoch, 0, '', 0, now})
  end
  previous = {tab = s.tab, epoch = s.epoch}
end

-- Write state: end the handoff, and revoke.
clear_handoff(s)
if revoked then
  s.epoch, s.granted_us, s.expires_us, s.ended_epoch = epoch, now, now, epoch
  s.transitions = s.transitions + 1
  state_set('epoch', int(epoch), 'granted_us', int(now), 'expires_us', int(now),
    'transitions', int(s.transitions), 'ended_epoch', int(epoch))
  drop_holder(s, 'rel_tab', 'rel_epoch')
  index_remove()
  emit({type = 'revoked', epoch = int(epoch), prev = {tab = previous.tab, epoch = int(previous.epoch)},
    reason = reason, at = int(now)})
  record('revoke', epoch, now, 'adm', admin, 'ptab', previous.tab, 'pep', int(previous.epoch),
    'r', reason, tunpack(rid_field))
end

-- Write state: block.
if block_ms > 0 then
  s.block_until_us = now + block_ms * 1000
  state_set('block_until_us', int(s.block_until_us))
  record('block', s.epoch, now, 'adm', admin, 'r', reason, 'until', int(s.block_until_us),
    tunpack(rid_field))
end

-- Remember the answer for retries, and answer.
local until_us = s.block_until_us > now and s.block_until_us or 0
local ptab, pep = '', 0
if previous ~= nil then
  ptab, pep = previous.tab, previous.epoch
end
if request ~= '' and window_ms > 0 then
  rcall('SET', KEY_REVOKE, cmsgpack.pack({revoked and 1 or 0, s.epoch, until_us, ptab, pep}),
    'PX', int(window_ms))
  state_set('keep_us', int(now + window_ms * 1000))
  s.keep_us = now + window_ms * 1000
end
return finish(s, now, {'OK', revoked and 1 or 0, s.epoch, until_us, ptab, pep, now})
