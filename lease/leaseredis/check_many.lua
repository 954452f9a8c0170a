-- check_many.lua: the usual checks of several leases in one call, each as check.lua makes it in
-- the lease form. The engine sends the checks of concurrent calls so (batch.go), as it does the
-- usual renews (renew_many.lua): the function call's own work and TIME are shared.
-- KEYS[2i-1], KEYS[2i]  the lease form's keys of lease i (see state.lua): its state hash, and the
--                       sessions kept of its user. On a Cluster, all in one slot (the engine sends
--                       the checks of one user together there).
-- ARGV[1]               the common arguments (see state.lua)
-- ARGV[2i], ARGV[2i+1]  check.lua's ARGV[2..3] for lease i: tab id, epoch
-- Answers a list with an entry per lease, in their order: what check.lua answers in the lease
-- form, the usual check's answer or "DEFER", the check having changed nothing (the engine then
-- makes that check alone, with every key). The store clock is read once, for all of them.
-- (lease_calls, in events.lua, takes each lease's keys in turn and calls begin for each.)
if #keys < 2 or #keys % 2 ~= 0 or #argv ~= 1 + #keys then
  error('tablease: check_many takes two keys and two arguments per lease')
end
return lease_calls(keys, argv, 2, usual_check)
