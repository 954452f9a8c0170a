-- catalog.lua: record a change of the tool catalog by an admin, in the admin's audit log.
-- KEYS[1]  <prefix>:{<admin>}:audit         the admin's audit log, a stream (see admin.lua)
-- KEYS[2]  <prefix>:{<admin>}:audit:admin   the admins' records of that user, the same record
-- ARGV[1]  the admin's sub
-- ARGV[2]  what changed (the reason of the record)
-- ARGV[3]  the length of the logs (XADD MAXLEN ~)
-- ARGV[4]  how long a record is kept, in milliseconds
-- Answers the id of the record. The record is an admin's (see admin.lua): s "catalog", a
-- "catalog", adm, r and at, its id by the rule of lease.NextEventID after the newest of both logs.
local key, admin_key = KEYS[1], KEYS[2]
if string.match(key or '', '^.+:{[^}]+}:audit$') == nil or admin_key ~= key .. ':admin' then
  error('tablease: KEYS[1] and KEYS[2] are not the audit logs of a user')
end
local len, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[1] == '' or ARGV[2] == '' or len == nil or len < 1 or retention == nil or retention < 1 then
  error('tablease: bad arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local ms, seq = now_ms, 0
for _, k in ipairs({key, admin_key}) do
  local top = redis.call('XREVRANGE', k, '+', '-', 'COUNT', '1')
  if top[1] then
    local m, q = string.match(top[1][1], '^(%d+)-(%d+)$')
    m, q = tonumber(m), tonumber(q)
    if m > ms or (m == ms and q + 1 > seq) then
      ms, seq = m, q + 1
    end
  end
end
local id = string.format('%d-%d', ms, seq)
local oldest = string.format('%d', math.max(now_ms - retention, 0))
for _, k in ipairs({key, admin_key}) do
  redis.call('XADD', k, 'MAXLEN', '~', string.format('%d', len), id, 's', 'catalog', 'a', 'catalog',
    'at', string.format('%d', now), 'adm', ARGV[1], 'r', ARGV[2])
  redis.call('XTRIM', k, 'MINID', '~', oldest)
  redis.call('PEXPIRE', k, string.format('%d', retention))
end
return id
