-- leases.lua: read the leases of some sessions of one user for Admin.ListLeases, and drop from the
-- user's index the sessions whose lease is not held.
-- KEYS[1]     <prefix>:{<sub>}:sessions      the user's index of held leases (see admin.lua)
-- KEYS[2..n]  <prefix>:{<sub>}:lease:<sid>   state hashes of the same user (see state.lua), as the
--                                            engine found their sessions in the index
-- Answers {now_us, sid, tab, label, hidden (1|0), epoch, granted_us, expires_us, ttl_ms,
-- transitions, ho_tab, ho_label, ho_hidden (1|0), ho_until_us, block_until_us, …}: the leases of
-- KEYS[2..n] held at now_us (tab set and expires_us after now), in the order of KEYS, each with the
-- handoff request pending at now_us ('', '', 0, 0 when none; see pending_handoff in state.lua: a
-- held lease has no reservation) and the end of the admin's block in force at now_us (0 when none,
-- as reply in state.lua answers it). It announces nothing, and it drops from the index the sessions
-- it finds without a held lease, but those whose lease expired and was not announced yet: the call
-- that next touches the session, or the engine's sweep (sweep.go), announces that expiry, records
-- it and takes the session out. So the index holds no more than the held leases and those that
-- expired since the last sweep.
local index = KEYS[1]
local prefix, user = string.match(index or '', '^(.+):{([^}]+)}:sessions$')
if prefix == nil then
  error('tablease: KEYS[1] is not the index of a user')
end
local tag = prefix .. ':{' .. user .. '}:lease:'
for i = 2, #KEYS do
  if #KEYS[i] <= #tag or string.sub(KEYS[i], 1, #tag) ~= tag then
    error('tablease: KEYS[' .. i .. '] is not a state key of the user of KEYS[1]')
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {now}
for i = 2, #KEYS do
  local sid = string.sub(KEYS[i], #tag + 1)
  local v = redis.call('HMGET', KEYS[i], 'tab', 'label', 'hidden', 'epoch', 'granted_us', 'expires_us',
    'ttl_ms', 'transitions', 'ho_tab', 'ho_label', 'ho_hidden', 'ho_from_epoch', 'ho_until_us',
    'ho_reserved', 'block_until_us', 'ended_epoch')
  local expires = tonumber(v[6]) or 0
  if v[1] and v[1] ~= '' and expires > now then
    out[#out + 1] = sid
    out[#out + 1] = v[1]
    out[#out + 1] = v[2] or ''
    out[#out + 1] = v[3] == '1' and 1 or 0
    out[#out + 1] = tonumber(v[4]) or 0
    out[#out + 1] = tonumber(v[5]) or 0
    out[#out + 1] = expires
    out[#out + 1] = tonumber(v[7]) or 0
    out[#out + 1] = tonumber(v[8]) or 0
    local ho_until = tonumber(v[13]) or 0
    local pending = v[9] and v[9] ~= '' and v[14] ~= '1' and ho_until > now
      and (tonumber(v[12]) or 0) == (tonumber(v[4]) or 0)
    if pending then
      out[#out + 1] = v[9]
      out[#out + 1] = v[10] or ''
      out[#out + 1] = v[11] == '1' and 1 or 0
      out[#out + 1] = ho_until
    else
      out[#out + 1] = ''
      out[#out + 1] = ''
      out[#out + 1] = 0
      out[#out + 1] = 0
    end
    local block = tonumber(v[15]) or 0
    out[#out + 1] = block > now and block or 0
  elseif not (v[1] and v[1] ~= '' and v[4] and v[4] ~= v[16]) then
    redis.call('ZREM', index, sid) -- free, and its end announced (or its state forgotten)
  end
end
return out
