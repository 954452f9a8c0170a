-- release.lua: end the lease held by a tab at an epoch.
-- KEYS[1]  the state hash of the session (see state.lua)
-- ARGV[1]  tab id
-- ARGV[2]  epoch
-- Answers "RELEASED" and the free lease when the tab held it at that epoch, and also when the
-- lease is still free since a release of that tab and epoch ended it (a retry); "KEPT" and the
-- lease as it is otherwise: a stale release never touches a newer lease.
local key = KEYS[1]
local tab = ARGV[1]
local epoch = arg_int(2, 1, MAX_EPOCH)

local now = now_us()
local s = load(key)
if held_by(s, now, tab, epoch) then
  redis.call('HSET', key, 'expires_us', int(now), 'rel_tab', tab, 'rel_epoch', int(epoch))
  redis.call('HDEL', key, 'tab', 'label', 'hidden')
  s.tab, s.label, s.hidden, s.expires_us = '', '', false, now
  return reply('RELEASED', s, now)
end
if not held(s, now) and s.rel_tab == tab and s.rel_epoch == epoch then
  return reply('RELEASED', s, now)
end
return reply('KEPT', s, now)
