-- usenonce.lua: record the use of a nonce of the current generation (see nonce.go).
-- KEYS[1]  <prefix>:{nonces}:generation   the generation
-- KEYS[2]  <prefix>:{nonces}:n:<nonce>     the nonce's use
-- ARGV[1]  the generation the nonce carries
-- ARGV[2]  a random mark of this call
-- ARGV[3]  the TTL in milliseconds
-- Answers 1 when the use is fresh: the nonce is of the current generation and was not used, or
-- its use is this call's (ARGV[2], a retry by go-redis); 0 otherwise, writing nothing for a nonce
-- of another generation.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local prev = redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3], 'GET')
if prev == false or prev == ARGV[2] then
  return 1
end
return 0
