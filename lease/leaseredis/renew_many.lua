-- renew_many.lua: the usual renews of several leases in one call, each as renew.lua makes it in
-- the lease form. The engine sends the renews of concurrent calls so (batch.go): a call costs
-- Redis the function call's own work (the command, the KEYS and ARGV tables, entering Lua) and
-- TIME whatever it does, a quarter of the instructions of the usual renew, which renews called
-- together share.
-- KEYS[2i-1], KEYS[2i]  the lease form's keys of lease i (see state.lua): its state hash, and the
--                       sessions kept of its user. On a Cluster, all in one slot (the engine sends
--                       the renews of one user together there).
-- ARGV[1]               the common arguments (see state.lua)
-- ARGV[4i-2..4i+1]      renew.lua's ARGV[2..5] for lease i: tab id, epoch, hidden flag, TTL
-- Answers a list with an entry per lease, in their order: what renew.lua answers in the lease
-- form, the usual renew's answer or "DEFER", the renew having changed nothing (the engine then
-- makes that renew alone, with every key). The store clock is read once, for all of them.
-- (lease_calls, in events.lua, takes each lease's keys in turn and calls begin for each.)
if #keys < 2 or #keys % 2 ~= 0 or #argv ~= 1 + 2 * #keys then
  error('tablease: renew_many takes two keys and four arguments per lease')
end
return lease_calls(keys, argv, 4, usual_renew)
