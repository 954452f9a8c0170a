-- renew.lua: extend the lease held by a tab at an epoch.
-- KEYS[1..8]  the keys of the session and of its user, or KEYS[1..2] in the lease form (see
--             state.lua)
-- ARGV[1]  the common arguments (see state.lua)
-- ARGV[2]  tab id
-- ARGV[3]  epoch
-- ARGV[4]  "1" when the tab is hidden, "0" when visible
-- ARGV[5]  TTL in milliseconds, already clamped
-- Answers "OK" and the lease, extended from now by the TTL, when the tab holds it at that epoch
-- and it has not expired; "LOST" and the lease as it is otherwise. A renew never resurrects.
-- The answer of a lease with no handoff and no block in force is short, one string (reply in
-- state.lua; usual_answer for the usual renew).
-- A renew keeps no answer for its retries: one that go-redis sends again decides again, which is
-- an answer the first could have given. It extends again from a later now, which is what the
-- caller asked for, or it answers "LOST" when another call ended the lease in between: ended
-- leases never come back, so a renew that answered "LOST" never becomes "OK".
--
-- Events: "updated" when the hidden flag changed, after what settle announces. The usual renew,
-- which only extends the lease (the same hidden flag, an expiry no earlier, no handoff in
-- progress), announces nothing and does not settle: the lease it extends has not expired, and the
-- presence entries that lapsed are announced by the next call that announces something, or by the
-- settle timers of the watchers (deadline in events.lua), at their expiry all the same. It reads
-- only the fields it decides and answers with (read_usual), so it is three commands: TIME, HMGET
-- and HSET (and the PEXPIRETIME of keep when keep_held in events.lua needs it), and it decides on
-- them as strings, making no state (read_usual says why), but when keep_held needs one. Any other
-- renew reads the rest of the state too (load_rest).
-- Called in the lease form (see state.lua), it does the usual renew, and answers "DEFER",
-- changing nothing, for any other.

-- The usual renew (see above): the lease held by the tab at the epoch (read_usual), with the
-- hidden flag and the TTL the hash holds (so they are valid), extended to no earlier an expiry
-- (usual_renew in events.lua; renew_many.lua makes several in one call).
local tab = ARGV[2]
local now = now_us()
local answer, v, held_until = usual_renew(now, tab, ARGV[3], ARGV[4], ARGV[5])
if answer then
  return answer
end

-- Validate, and decide; settle expiry when the renew announces something.
local hidden = ARGV[4] == '1'
local s = lease_state(v)
local epoch = arg_int(3, 1, MAX_EPOCH)
local ttl_ms = arg_int(5, 1, MAX_EPOCH)
local expires = now + ttl_ms * 1000
if held_until == nil or s.hidden ~= hidden or expires < s.expires_us then
  if LEASE_ONLY then
    return 'DEFER'
  end
  s = load_rest(s, now)
  if not held_by(s, now, tab, epoch) then
    settle(s, now)
    return finish(s, now, reply('LOST', s, now))
  end
end
local changed = s.hidden ~= hidden
local earlier = expires < s.expires_us
if changed or earlier then
  settle(s, now)
end

-- Write state.
if earlier then
  deadline_earlier()
end
-- (The lease is held, so its state is the hash, never parked: HSET rather than state_set.)
-- The expiry and now are new numbers on every renew, written once each: string.format rather
-- than int, whose table of the numbers written lately they would only grow (see int in state.lua).
local expires_s = sformat('%d', expires)
if changed or ttl_ms ~= s.ttl_ms then
  rcall('HSET', KEY_STATE, 'hidden', hidden and '1' or '0', 'expires_us', expires_s,
    'ttl_ms', int(ttl_ms))
else
  rcall('HSET', KEY_STATE, 'expires_us', expires_s)
end
s.hidden, s.expires_us, s.ttl_ms, s.expires_s = hidden, expires, ttl_ms, expires_s

-- Append event.
if changed then
  emit(lease_event('updated', s, now))
end
return finish(s, now, reply('OK', s, now))
