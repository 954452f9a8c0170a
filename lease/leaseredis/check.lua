-- check.lua: confirm that a tab holds the lease at an epoch. It writes nothing but what settle
-- announces, and the usual check, which confirms, settles nothing.
-- KEYS[1..8]  the keys of the session and of its user, or KEYS[1..2] in the lease form (see
--             state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  tab id
-- ARGV[3]  epoch
-- Answers "OK" and the lease when the tab holds it at that epoch, "LOST" and the lease otherwise.
-- Called in the lease form (see state.lua), it does the usual check, and answers "DEFER",
-- changing nothing, for any other.

-- Validate (the epoch once the lease is read: arg_held in state.lua).
local tab = ARGV[2]

-- The usual check, of a tab that holds the lease with no handoff in progress, reads only
-- load_lease's fields and settles nothing, as the usual renew (renew.lua says why).
local now = now_us()
local s = load_lease()
local epoch = arg_held(3, 1, MAX_EPOCH, s.read[4], s.epoch)
if usual_held(s, now, tab, epoch) then
  return finish(s, now, reply('OK', s, now))
end
if LEASE_ONLY then
  return 'DEFER'
end

-- Settle expiry.
s = load_rest(s, now)
settle(s, now)

-- Decide.
if held_by(s, now, tab, epoch) then
  return finish(s, now, reply('OK', s, now))
end
return finish(s, now, reply('LOST', s, now))
