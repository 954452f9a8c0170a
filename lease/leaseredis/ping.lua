-- ping.lua: the readiness probe (Engine.Ping). It answers PONG and reads and writes nothing, but
-- it is a function of the library like the others, so it fails where they would: on a Redis that
-- refuses FCALL (an ACL user without @scripting), on a read-only replica (which refuses the
-- functions that may write), or on one without the library (which the engine then loads). It reads
-- TIME, as every session script does first, so that an ACL user whose rules leave TIME out (it is
-- in no category but @fast) is not ready either. It may run at maxmemory, as the calls that read
-- do. It publishes an empty message where events are published (publish in events.lua), to a
-- channel of its own that no instance listens to, so that an ACL user whose channels leave out the
-- prefix's is not ready either: its events would be refused. On a Cluster it asks CLUSTER MYID
-- first, as publish does, so that a user who may not ask it is not ready: its events would go where
-- no instance listens. The engine names the topology, which fixes where to publish for every call.
-- KEYS[1..2]  the lease form (see state.lua) of a session the engine names for the probe
-- ARGV[1]     the common arguments (see state.lua)
-- ARGV[2]     "cluster" when the engine talks to a Redis Cluster, "single" otherwise
-- Answers "PONG".

redis.call('TIME')
if ARGV[2] == 'cluster' then
  rcall('CLUSTER', 'MYID')
  sharded = true
  rcall('SPUBLISH', TAG .. 'ready', '')
elseif ARGV[2] == 'single' then
  sharded = false
  rcall('PUBLISH', PREFIX .. ':ready', '')
else
  error('tablease: ARGV[2] is not a topology')
end
return 'PONG'
