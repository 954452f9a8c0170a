-- renew.lua: extend the lease held by a tab at an epoch.
-- KEYS[1]  the state hash of the session (see state.lua)
-- ARGV[1]  tab id
-- ARGV[2]  epoch
-- ARGV[3]  "1" when the tab is hidden, "0" when visible
-- ARGV[4]  TTL in milliseconds, already clamped
-- Answers "OK" and the lease, extended from now by the TTL, when the tab holds it at that epoch
-- and it has not expired; "LOST" and the lease as it is otherwise. A renew never resurrects.
-- A retried renew extends again from a later now, which is what the caller asked for.
local key = KEYS[1]
local tab = ARGV[1]
local epoch = arg_int(2, 1, MAX_EPOCH)
local hidden = ARGV[3] == '1' and '1' or '0'
local ttl_ms = arg_int(4, 1, MAX_EPOCH)

local now = now_us()
local s = load(key)
if not held_by(s, now, tab, epoch) then
  return reply('LOST', s, now)
end
local expires = now + ttl_ms * 1000
redis.call('HSET', key, 'hidden', hidden, 'expires_us', int(expires), 'ttl_ms', int(ttl_ms))
s.hidden, s.expires_us, s.ttl_ms = hidden == '1', expires, ttl_ms
return reply('OK', s, now)
