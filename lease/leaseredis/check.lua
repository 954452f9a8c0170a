-- check.lua: confirm that a tab holds the lease at an epoch. It writes nothing but what settle
-- announces, and the usual check, which confirms, settles nothing.
-- KEYS[1..8]  the keys of the session and of its user, or KEYS[1..2] in the lease form (see
--             state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  tab id
-- ARGV[3]  epoch
-- Answers "OK" and the lease when the tab holds it at that epoch, "LOST" and the lease otherwise.
-- The answer of a lease with no handoff and no block in force is short, one string (reply in
-- state.lua; usual_answer for the usual check).
-- Called in the lease form (see state.lua), it does the usual check, and answers "DEFER",
-- changing nothing, for any other.

-- The usual check, of a tab that holds the lease with no handoff in progress, reads only
-- LEASE_FIELDS and settles nothing, as the usual renew (renew.lua says why).
-- (usual_check in events.lua; check_many.lua makes several in one call.)
local tab = ARGV[2]
local now = now_us()
local answer, v = usual_check(now, tab, ARGV[3])
if answer then
  return answer
end
local s = lease_state(v)

-- Validate.
local epoch = arg_int(3, 1, MAX_EPOCH)
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
