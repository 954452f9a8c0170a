-- state.lua: the prelude of every script of this package; scripts.go puts it in front of each.
-- It declares no KEYS or ARGV of its own: the functions below take the key from their script.
-- It reads the state hash and shapes answers; it never writes.
--
-- The state of a session is one hash, KEYS[1] of every script, that never expires (the epoch
-- counter must not live in a key that expires). Fields:
--   tab, label, hidden   the holder ("1" when hidden); absent after a release
--   epoch                the last epoch granted; kept after release and expiry
--   granted_us           store time (µs) when epoch was granted
--   expires_us           store time (µs) when the lease ends, or ended when released; the lease is
--                        held while tab is set and expires_us > now
--   ttl_ms               TTL of the last grant or renew
--   transitions          number of epochs granted
--   rel_tab, rel_epoch   the lease the last release ended, until the next grant, so that a
--                        retried release gets the answer of the first
-- Reserved for later work, not written yet: ho_tab, ho_until_us (a pending handoff) and
-- block_until_us (an admin block). Scripts ignore fields they do not know.
--
-- Numbers: Lua numbers are doubles, exact for integers below 2^53, which bounds epochs and
-- microsecond times alike. They are written with string.format('%d') and answered as integer
-- replies, never through tostring (which would print 1.7e+15).

-- now_us is the store clock in microseconds. Redis 7 replicates the effects of scripts, so a
-- script may read TIME and then write.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end

-- load reads the state hash; a session that never had a lease reads as zeros.
local function load(key)
  local v = redis.call('HMGET', key, 'tab', 'label', 'hidden', 'epoch', 'granted_us',
    'expires_us', 'ttl_ms', 'transitions', 'rel_tab', 'rel_epoch')
  return {
    tab = v[1] or '',
    label = v[2] or '',
    hidden = v[3] == '1',
    epoch = tonumber(v[4]) or 0,
    granted_us = tonumber(v[5]) or 0,
    expires_us = tonumber(v[6]) or 0,
    ttl_ms = tonumber(v[7]) or 0,
    transitions = tonumber(v[8]) or 0,
    rel_tab = v[9] or '',
    rel_epoch = tonumber(v[10]) or 0,
  }
end

local function held(s, now)
  return s.tab ~= '' and s.expires_us > now
end

local function held_by(s, now, tab, epoch)
  return held(s, now) and s.tab == tab and s.epoch == epoch
end

-- reply is the answer of every script: {status, held, tab, label, hidden, epoch, granted_us,
-- expires_us, ttl_ms, transitions, now_us}. The holder fields are empty unless the lease is held.
local function reply(status, s, now)
  if held(s, now) then
    return {status, 1, s.tab, s.label, s.hidden and 1 or 0, s.epoch, s.granted_us, s.expires_us,
      s.ttl_ms, s.transitions, now}
  end
  return {status, 0, '', '', 0, s.epoch, s.granted_us, s.expires_us, s.ttl_ms, s.transitions, now}
end

-- arg_int reads ARGV[i] as an integer in [lo, hi), or raises an error before anything is written.
local function arg_int(i, lo, hi)
  local n = tonumber(ARGV[i])
  if n == nil or n ~= math.floor(n) or n < lo or n >= hi then
    error('tablease: ARGV[' .. i .. '] is not an integer in range')
  end
  return n
end

local MAX_EPOCH = 9007199254740992 -- 2^53, exclusive
