-- acquire.lua: grant the lease of a session to a tab.
-- KEYS[1]  the state hash of the session (see state.lua)
-- ARGV[1]  tab id
-- ARGV[2]  label
-- ARGV[3]  "1" when the tab is hidden, "0" when visible
-- ARGV[4]  TTL in milliseconds, already clamped
-- ARGV[5]  mode: "try" or "takeover"
-- Answers "OK" and the lease granted; "HELD" and the lease of another tab when the mode is try;
-- "EXHAUSTED" when the next epoch would reach 2^53.
--
-- The holder acquiring again, in either mode, keeps its epoch and gets its lease extended: so a
-- retried call (go-redis resends a command whose answer was lost) never mints a second epoch.
-- Every other grant (free, expired, released, or a takeover) gets max(last+1, now_us).
local key = KEYS[1]
local tab, label = ARGV[1], ARGV[2]
local hidden = ARGV[3] == '1' and '1' or '0'
local ttl_ms = arg_int(4, 1, MAX_EPOCH)
local mode = ARGV[5]
if mode ~= 'try' and mode ~= 'takeover' then
  error('tablease: ARGV[5] is not a mode')
end

local now = now_us()
local s = load(key)
local expires = now + ttl_ms * 1000

if held(s, now) then
  if s.tab == tab then
    redis.call('HSET', key, 'label', label, 'hidden', hidden, 'expires_us', int(expires),
      'ttl_ms', int(ttl_ms))
    s.label, s.hidden, s.expires_us, s.ttl_ms = label, hidden == '1', expires, ttl_ms
    return reply('OK', s, now)
  end
  if mode ~= 'takeover' then
    return reply('HELD', s, now)
  end
end

local epoch = math.max(s.epoch + 1, now)
if epoch >= MAX_EPOCH then
  return reply('EXHAUSTED', s, now)
end
s.tab, s.label, s.hidden = tab, label, hidden == '1'
s.epoch, s.granted_us, s.expires_us, s.ttl_ms = epoch, now, expires, ttl_ms
s.transitions = s.transitions + 1
redis.call('HSET', key, 'tab', tab, 'label', label, 'hidden', hidden, 'epoch', int(epoch),
  'granted_us', int(now), 'expires_us', int(expires), 'ttl_ms', int(ttl_ms),
  'transitions', int(s.transitions))
redis.call('HDEL', key, 'rel_tab', 'rel_epoch')
return reply('OK', s, now)
