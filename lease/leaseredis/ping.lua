-- ping.lua: the readiness probe (Engine.Ping). It answers PONG and reads and writes nothing, but
-- it is a function of the library like the others, so it fails where they would: on a Redis that
-- refuses FCALL (an ACL user without @scripting), on a read-only replica (which refuses the
-- functions that may write), or on one without the library (which the engine then loads). It reads
-- TIME, as every session script does first, so that an ACL user whose rules leave TIME out (it is
-- in no category but @fast) is not ready either. It may run at maxmemory, as the calls that read
-- do.
-- KEYS[1..2]  the lease form (see state.lua) of a session the engine names for the probe
-- ARGV[1..7]  the common arguments (see state.lua)
-- Answers "PONG".

redis.call('TIME')
return 'PONG'
