-- document.lua: store a new version of a document when its current version is the expected one.
-- KEYS[1]  the document hash (see document.go): fields version, data, updated_us; never expires
-- ARGV[1]  the expected current version: a version, "" (only when the document does not exist)
--          or "*" (whatever the current version)
-- ARGV[2]  the new version (an identifier, validated by the caller)
-- ARGV[3]  the new data (bytes; at most 1 MiB, checked by the caller)
-- Answers {"OK", version, updated_us} after the write, with updated_us from the store clock, or
-- {"MISMATCH", current version ("" when absent), 0} without writing anything. The comparison and
-- the write are this one script: no other write can come between them.
local key = KEYS[1]
local expected = ARGV[1]
local version = ARGV[2]
local data = ARGV[3]
if version == nil or version == '' or data == nil then
  error('tablease: ARGV[2] and ARGV[3] are required')
end

local current = redis.call('HGET', key, 'version') -- false when the document does not exist
if expected ~= '*' then
  if expected == '' then
    if current then
      return {'MISMATCH', current, 0}
    end
  elseif current ~= expected then
    return {'MISMATCH', current or '', 0}
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', key, 'version', version, 'data', data, 'updated_us', string.format('%d', now))
return {'OK', version, now}
