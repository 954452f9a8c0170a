-- audit.lua: read one user's audit log, newest first, for Admin.Audit.
-- KEYS[1]  <prefix>:{<sub>}:audit         the user's audit log, a stream (see admin.lua)
-- KEYS[2]  <prefix>:{<sub>}:audit:admin   the admins' records of the user, a stream with the
--                                         same ids: read with KEYS[1] as one log (see admin.lua)
-- ARGV[1]  the newest id to read: "+", "<ms>-<seq>" (that entry included) or "(<ms>-<seq>" (not)
-- ARGV[2]  the session whose records to answer, or "" for every session of the user
-- ARGV[3]  the most records to answer, at least 1
-- ARGV[4]  the most entries to look at, at least 1: a session's records may be few among many
-- ARGV[5]  the retention in ms: entries appended before now - retention are not read
-- ARGV[6]  a horizon in ms, or "": the engine reads up to it, and only once the store clock has
--          passed it, so that nothing appended after the read can sort before it (see admin.go)
-- Answers {"WAIT", now_us}, having read nothing, while the store clock in ms is not past ARGV[6];
-- otherwise {"OK", now_us, more (1|0), from, entry, …}: the entries kept, newest first, as
-- XREVRANGE answers them ({id, {field, value, …}}); from is where to go on, "(" and the id of the
-- oldest entry looked at (ARGV[1] when none was); more is 0 when no older entry within the
-- retention is left to look at. It writes nothing.
local key, admin_key = KEYS[1], KEYS[2]
if string.match(key or '', '^.+:{[^}]+}:audit$') == nil or admin_key ~= key .. ':admin' then
  error('tablease: KEYS[1] and KEYS[2] are not the audit logs of a user')
end
local function arg_int(i, lo)
  local n = tonumber(ARGV[i])
  if n == nil or n ~= math.floor(n) or n < lo or n >= 9007199254740992 then
    error('tablease: ARGV[' .. i .. '] is not an integer in range')
  end
  return n
end
local newest, session = ARGV[1], ARGV[2]
local count, budget, retention_ms = arg_int(3, 1), arg_int(4, 1), arg_int(5, 1)
local horizon = nil
if ARGV[6] ~= '' then
  horizon = arg_int(6, 0)
end
if newest == nil or newest == '' or session == nil then
  error('tablease: ARGV[1] and ARGV[2] are required')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
if horizon ~= nil and now_ms <= horizon then
  return {'WAIT', now}
end
local oldest = string.format('%d', math.max(now_ms - retention_ms, 0))

-- session_of is the session field of an entry's field list.
local function session_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 's' then
      return fields[i + 1]
    end
  end
  return ''
end

-- newer reports whether stream id a is after b.
local function newer(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  if ams ~= bms then
    return ams > bms
  end
  return tonumber(aseq) > tonumber(bseq)
end

-- batch answers the next n entries of the one log, newest first from from: the n newest of each
-- stream, merged, an admin's record that is in both once; last is true when they are all that is
-- left of both streams.
local function batch(from, n)
  local a = redis.call('XREVRANGE', key, from, oldest, 'COUNT', n)
  local b = redis.call('XREVRANGE', admin_key, from, oldest, 'COUNT', n)
  local out, i, j = {}, 1, 1
  while #out < n and (a[i] or b[j]) do
    if b[j] == nil or (a[i] and newer(a[i][1], b[j][1])) then
      out[#out + 1] = a[i]
      i = i + 1
    else
      if a[i] and a[i][1] == b[j][1] then
        i = i + 1
      end
      out[#out + 1] = b[j]
      j = j + 1
    end
  end
  return out, i > #a and j > #b and #a < n and #b < n
end

local kept = {}
local looked, done, from = 0, false, newest
while not done and #kept < count and looked < budget do
  local n = budget - looked
  if session == '' then
    n = math.min(n, count - #kept)
  else
    n = math.min(n, 100)
  end
  local entries, last = batch(from, n)
  local i = 0
  for _, entry in ipairs(entries) do
    i = i + 1
    looked = looked + 1
    from = '(' .. entry[1]
    if session == '' or session_of(entry[2]) == session then
      kept[#kept + 1] = entry
      if #kept == count then
        break
      end
    end
  end
  done = i == #entries and last
end

local out = {'OK', now, done and 0 or 1, from}
for _, entry in ipairs(kept) do
  out[#out + 1] = entry
end
return out
