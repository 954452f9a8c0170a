-- events.lua: the third prelude of the session scripts' library (after state.lua and admin.lua, before
-- presence.lua). It queues the events a script produces, appends them to the session's log and
-- publishes them, settles a handoff as the lease it asked for ends (reserve_handoff, clear_handoff),
-- and announces the expiry of a lease (settle_lease). It declares no KEYS or ARGV of its own.
--
-- A script calls emit() for each of its events, in order, and record() (admin.lua) for each of its
-- audit records, while it decides and writes, and finish() on every path that returns after the
-- validation: finish appends the queued audit records and events and publishes the events, so the
-- change, its events and its records are one step (a script that fails before finish has written
-- nothing: scripts validate first).
--
-- The log, KEYS[2], is a list of the last LOG_LEN events, oldest first: each entry is one string,
-- the event's id, a space and the event as JSON ("<ms>-<seq> {…}"). It is kept only for sessions
-- that are watched, since only a watch reads it (watch.lua: the replay of a resumed watch): the
-- watch and settle scripts, which the engine runs for the sessions it has watchers for (settle at
-- least every tenth of LOG_TTL_MS), create it when it is missing and keep it LOG_TTL_MS ms more
-- (keep_log), and an append pushes onto it only when it exists (RPUSHX), trims it to exactly
-- LOG_LEN entries and keeps it LOG_TTL_MS ms after that event. So the log of a session nobody watched in the last LOG_TTL_MS ms takes no memory, and a
-- watcher's log holds every event since its watch began. keep_log creates the log with a mark:
-- the id of the session's last event alone ("<ms>-<seq>", no JSON; "0-0" when it had none), which
-- stands for the log's start (the events before it are not in the log) and is never replayed.
-- (A list, not a stream: a stream's first node takes 4 KB, stream-node-max-bytes, however few
-- events it holds, where a list of one event takes about 300 bytes.) Event ids are those of
-- lease.NextEventID: the store clock in ms with sequence 0 when it is after the last id, else the
-- last id with sequence+1, so the entries are in the order of their ids. The last id is kept in the
-- state hash (event_id) as well as in the list, so ids keep increasing after the log expired.
--
-- Event JSON (numbers as decimal strings: cjson would print 1.7e+15):
--   {"type": "granted|released|expired|taken_over|revoked|handoff_requested|updated|joined|left",
--    "epoch": "…", "holder": {"tab","label","hidden"}, "prev": {"tab","epoch"},
--    "requester": {"tab","label","hidden"}, "reason": "…", "at": "<µs>",
--    "tab": {"id","label","hidden","connected": "<µs>"}}
-- with the fields of lease.Event that apply (absent otherwise).
--
-- Each event pushed onto the log is also published (see publish) as
--   {"u": user, "s": session, "id": "<ms>-<seq>", "p": "<ms>-<seq>", "ev": <event>, "now": "<µs>",
--    "next": "<µs>"}
-- where p is the id of the session's event before it ("" for none: the state hash's event_id, or
-- the log's newest, which watch.lua answers as a watch's position), and next is the session's next
-- deadline after the script (deadline below; "0" for none), which instances use to time the settle
-- script of the sessions they watch. A script that brings the
-- deadline earlier without an event (a renew with a shorter TTL) publishes {"u","s","now","next"}
-- alone, when the session has a log: a hint, not an event; it is not in the log.
-- Only the instances that watch a session read its messages, and a session has a log while one
-- watches it: from before its watch script reads the position of the watch (events published
-- before that are not sent to the watch) until after its last watcher went away. So an event of a
-- session with no log is not published, nor is its next deadline read: the events of sessions
-- nobody watches (a backend's leases, most free sessions) cost no encoding, no message and no
-- reading of presence, 5 % of the instructions of an acquire and a release
-- (scripts/redis-instructions), and no instance receives them. Should a watched session's log go
-- missing (the store lost it, or its keep failed for LOG_TTL_MS), the events appended meanwhile
-- are not published: an instance finds that its watch missed some when the next event it receives
-- names as p another event than the watch's last, or when the log's newest event, which its
-- settle reads, stays ahead of the watch's last (feed.go), and starts the watch over.

local pending -- the events of this call not appended yet, in order
local moved_earlier -- the deadline moved earlier without an event: publish a hint
local dropped -- the call deleted the holder: compact the hash (drop_holder)
-- tabs_first is the expiry (µs) of the session's earliest presence entry as this call read it
-- (settle_presence), false when it has none, nil when the call has not read it or changed the
-- entries since (join.lua, leave.lua): deadline reads it from Redis only then.
local tabs_first

-- events_begin starts a call with no event queued: with the empty queue of the last call, most
-- often (a call that failed may have left events queued), rather than a new table.
local function events_begin()
  if pending == nil or #pending > 0 then
    pending = {}
  end
  moved_earlier, dropped, tabs_first = false, false, nil
end

-- drop_holder deletes the holder of s and the other fields named (of s too), once its lease ended
-- and the end is announced: a free lease keeps no holder. Redis never shrinks a hash that a long
-- value (a label) turned into a hashtable, so flush writes it anew then, as the small listpack it
-- now fits, unless it parks the session.
local function drop_holder(s, ...)
  if not parking then
    rcall('HDEL', KEY_STATE, 'tab', 'label', 'hidden', ...)
  end
  s.tab, s.label, s.hidden = '', '', false
  for _, f in lipairs({...}) do
    s[f] = ltype(s[f]) == 'string' and '' or 0
  end
  dropped = true
end

local function emit(ev)
  pending[#pending + 1] = ev
end

-- deadline_earlier notes that the script brought the session's next deadline earlier.
local function deadline_earlier()
  moved_earlier = true
end

-- publish sends msg to the instances: on a Redis Cluster with SPUBLISH on the channel of the
-- user's hash tag, which only the user's shard carries (a PUBLISH is broadcast to every node),
-- elsewhere with PUBLISH on CHANNEL. The engine subscribes alike (see feed.go).
-- Whether the node is part of a Cluster is asked once: it is fixed for the life of a server, and so
-- is the library, which a restarted server loads anew.
-- The answer is kept only when it is one: a Cluster node answers its id, a Redis without cluster
-- support says so (and ping.lua, told by the engine, sets it). An ACL user without +cluster|myid
-- learns nothing (its calls publish with PUBLISH, where a Cluster's instances do not listen, and
-- its instance is not ready: ping.lua); the library is shared by every user of the node, so that
-- must not decide for the others.
local sharded = nil
local function is_sharded()
  if sharded == nil then
    local r = rpcall('CLUSTER', 'MYID')
    if ltype(r) == 'string' then
      sharded = true
    elseif ltype(r) == 'table' and ltype(r.err) == 'string' and string.find(r.err, 'cluster support disabled', 1, true) then
      sharded = false
    else
      return false
    end
  end
  return sharded
end

local function publish(msg)
  if is_sharded() then
    rcall('SPUBLISH', TAG .. 'events', msg)
  else
    rcall('PUBLISH', CHANNEL, msg)
  end
end

-- lease_event is an event of type t about the lease s as it is now: its epoch and holder.
local function lease_event(t, s, at)
  return {type = t, epoch = int(s.epoch), holder = {tab = s.tab, label = s.label, hidden = s.hidden},
    at = int(at)}
end

-- compare_ids answers -1, 0 or 1 as the id a is before, equal to or after b (both valid).
local function compare_ids(a, b)
  local ams, aseq = parse_id(a)
  local bms, bseq = parse_id(b)
  if ams ~= bms then
    return ams < bms and -1 or 1
  end
  if aseq ~= bseq then
    return aseq < bseq and -1 or 1
  end
  return 0
end

-- NO_EVENT is the id of the mark of a log created before the session's first event (keep_log).
local NO_EVENT = '0-0'

-- last_entry_id is the id of the newest entry of the log (its mark's when it has no event since
-- its creation), or '' when the session has no event in it.
local function last_entry_id()
  local top = rcall('LINDEX', KEY_EVENTS, '-1')
  if top then
    local id = smatch(top, '^%S+')
    if id ~= NO_EVENT then
      return id
    end
  end
  return ''
end

-- keep_log keeps the log of the watched session s LOG_TTL_MS ms more, creating it with its mark when
-- it is missing (see above). The watch and settle scripts call it. A session with no state counts
-- against the user's bound of sessions (admit in admin.lua) while its log lives: keep_log lists it
-- in the known set until then, so that watches cannot keep logs of ever more sessions.
local function keep_log(s, now)
  if rcall('PEXPIRE', KEY_EVENTS, LOG_TTL_S) == 0 then
    rcall('RPUSH', KEY_EVENTS, s.event_id ~= '' and s.event_id or NO_EVENT)
    rcall('PEXPIRE', KEY_EVENTS, LOG_TTL_S)
  end
  if not s.exists then
    know(mfloor(now / 1000) + LOG_TTL_MS)
  end
end

-- read_tabs_first reads the expiry of the session's earliest presence entry into tabs_first, and
-- answers it.
local function read_tabs_first()
  local first = rcall('ZRANGE', KEY_TABS, '0', '0', 'WITHSCORES')
  tabs_first = first[2] and first[2] + 0 or false
  return tabs_first
end

-- deadline is the store time (µs) after now at which something of the session expires that has
-- not been announced (the lease, or the earliest presence entry), or 0 when nothing will.
local function deadline(s, now)
  local next = 0
  if s.tab ~= '' and s.epoch ~= 0 and s.ended_epoch ~= s.epoch and s.expires_us > now then
    next = s.expires_us
  end
  local t = tabs_first
  if t == nil then
    t = read_tabs_first()
  end
  if t and (next == 0 or t < next) then
    next = t
  end
  return next
end

-- HANDOFF_FIELDS are the fields of the state hash that hold a handoff (see state.lua).
local HANDOFF_FIELDS = {'ho_tab', 'ho_label', 'ho_hidden', 'ho_from_tab', 'ho_from_epoch',
  'ho_until_us', 'ho_reserved', 'ho_reserve_ms'}

-- clear_handoff deletes the handoff of s, if any: every grant and every revoke end it, and so does
-- the gone release of its requester (release.lua).
local function clear_handoff(s)
  if s.ho_tab == '' then
    return
  end
  rcall('HDEL', KEY_STATE, tunpack(HANDOFF_FIELDS))
  s.ho_tab, s.ho_label, s.ho_hidden, s.ho_from_tab, s.ho_from_epoch = '', '', false, '', 0
  s.ho_until_us, s.ho_reserved, s.ho_reserve_ms = 0, false, 0
end

-- append appends the queued audit records (admin.lua), then the queued events to the log with
-- their ids when the session has a log, and publishes the events (or the hint).
local function append(s, now)
  flush_audit(now)
  if #pending == 0 then
    if moved_earlier and rcall('EXISTS', KEY_EVENTS) == 1 then
      publish(jencode({u = USER, s = SESSION, now = int(now),
        next = int(deadline(s, now))}))
    end
    return
  end
  -- The last id: the state hash's, which every append writes with the log; the log's newest only
  -- when the hash has none (it was lost, or expired before the log: the log outlives it by at
  -- most its TTL).
  local prev = s.event_id -- the id of the event before the next (p in the messages, see above)
  local ms, seq = parse_id(prev)
  if ms == nil then
    prev = last_entry_id()
    ms, seq = parse_id(prev)
  end
  ms, seq = ms or 0, seq or 0
  local now_ms = mfloor(now / 1000)
  local id, len, next
  local logged = true -- until a push finds no log: the session is not watched (see above)
  for _, ev in lipairs(pending) do
    if now_ms > ms then
      ms, seq = now_ms, 0
    else
      seq = seq + 1
    end
    id = int(ms) .. '-' .. int(seq)
    if logged then
      local json = jencode(ev)
      len = rcall('RPUSHX', KEY_EVENTS, id .. ' ' .. json)
      logged = len > 0
      if logged then
        next = next or int(deadline(s, now))
        -- The message of publish above, with the event's JSON as encoded for the log. The user
        -- and session are identifiers, of characters JSON writes as they are (lease.ValidateID).
        publish('{"u":"' .. USER .. '","s":"' .. SESSION .. '","id":"' .. id .. '","p":"' .. prev ..
          '","ev":' .. json .. ',"now":"' .. int(now) .. '","next":"' .. next .. '"}')
      end
    end
    prev = id
  end
  if logged then
    if len > LOG_LEN then
      rcall('LTRIM', KEY_EVENTS, LOG_TRIM_S, '-1')
    end
    rcall('PEXPIRE', KEY_EVENTS, LOG_TTL_S)
  end
  state_set('event_id', id)
  s.event_id = id
  note_id(id, ms, seq)
  pending = {}
end

-- parkable reports whether the session s may be parked at now (see state.lua): it has no holder,
-- no handoff, no block in force, and no revoke's retry window nor gone tab's window (keep_us), so
-- that it has only the fields that pack_free holds (a gone tab's mark, once its window ended, is
-- dropped), and the call has every key.
local function parkable(s, now)
  return KEY_FREE ~= nil and s.tab == '' and s.ho_tab == '' and s.block_until_us <= now and
    s.keep_us <= now
end

-- unpark moves the parked state s to the state hash, to which the call wrote the rest: the hash
-- gets the fields of pack_free, as s has them now (unless the call wrote them all: s.whole), and
-- the field is deleted.
local function unpark(s)
  if s.whole then
    rcall('HDEL', KEY_FREE, SESSION)
    s.parked = nil
    return
  end
  local fields = {'epoch', int(s.epoch), 'granted_us', int(s.granted_us), 'expires_us',
    int(s.expires_us), 'ttl_ms', int(s.ttl_ms), 'transitions', int(s.transitions), 'ended_epoch',
    int(s.ended_epoch)}
  local function add(f, v)
    fields[#fields + 1] = f
    fields[#fields + 1] = v
  end
  if s.rel_tab ~= '' then
    add('rel_tab', s.rel_tab)
    add('rel_epoch', int(s.rel_epoch))
  end
  if s.event_id ~= '' then
    add('event_id', s.event_id)
  end
  state_set(tunpack(fields))
  rcall('HDEL', KEY_FREE, SESSION)
  s.parked = nil
end

-- covered is keep_held's test of kept: whether it covers at_ms, the keep_until of the lease whose
-- LEASE_FIELDS the call read as v (the epoch and expires_us strings v[4] and v[6]) and to which it
-- wrote the expiry expires_s, or nil when it wrote none. It then moves kept to that expiry.
local function covered(v, at_ms, expires_s)
  local kept = SESSION_ENTRY.kept
  if at_ms ~= nil and kept ~= nil and kept[1] == v[4] and kept[2] == v[6] and kept[3] >= at_ms then
    kept[2] = expires_s or v[6]
    return true
  end
  return false
end

-- keep_held is keep for a call that queued nothing, of a session with a holder and no handoff, in
-- its hash: it moves the hash's expiry only when it is before keep_until (keep never brings it
-- earlier then), which it learns with PEXPIRETIME, a command of the usual renew and check that costs
-- Redis some 5 % of a renew's instructions. So it keeps, with the session's keys (SESSION_ENTRY in
-- state.lua), kept = {epoch, expires_us, at}: at is a time no later than the hash's expiry for as
-- long as the hash holds that lease (the epoch and expires_us strings as the hash holds them). While
-- they are those the call read, and at is no earlier than keep_until, the expiry is not before it
-- either, and PEXPIRETIME is not asked. at stays no later than the expiry because only a change
-- brings the expiry earlier, and every call of the library that may change the session forgets
-- kept (flush), whatever the options of the instance that made it; a change made by another
-- library (an instance of another version) brings it no earlier than its keep_until plus the slack
-- (keep), which for the same lease (epoch and expires_us) and the same idle retention is no earlier
-- than the keep_until computed here: a handoff's end only adds to keep_until, a held lease's block
-- ended before its grant, its keep_us only grows (a revoke, which may lower it, ends the lease),
-- and now counts only once the lease ended. So at is keep_until plus the slack when keep moved the
-- expiry there, else the earlier of that and the expiry PEXPIRETIME answered. A renew writes a later
-- expires_us (s.expires_s), which only moves keep_until later, and kept follows it; a lease whose
-- hash has no expiry, or whose keep_until is nil, keeps nothing. The usual renew and check are
-- then three and two commands, PEXPIRETIME once per eighth of the idle retention or so, when keep
-- moves the expiry (scripts/redis-instructions: 4 % fewer instructions per renew).
local function keep_held(s, now)
  local entry, v = SESSION_ENTRY, s.read
  local at_ms = keep_until(s, now, false)
  if covered(v, at_ms, s.expires_s) then
    return
  end
  local kept = entry.kept
  local current = rcall('PEXPIRETIME', KEY_STATE)
  keep(s, now, false, current, false, false)
  if at_ms == nil or current < 0 then
    entry.kept = nil
    return
  end
  local at = at_ms + KEEP_SLACK_MS
  if current >= at_ms and current < at then
    at = current
  end
  if kept == nil then
    kept = {}
    entry.kept = kept
  end
  kept[1], kept[2], kept[3] = v[4], s.expires_s or v[6], at
end

-- keep_usual is what flush does for the usual renew and check (keep_held), without a state unless
-- keep_held needs one: v are the LEASE_FIELDS the call read (read_usual), expires_us the lease's
-- expiry now, and expires_s that expiry as the call wrote it, or nil when it wrote none.
local function keep_usual(v, now, expires_us, expires_s)
  if not covered(v, retention(expires_us, (v[9] or 0) + 0, v[4] + 0), expires_s) then
    local s = lease_state(v)
    s.expires_us, s.expires_s = expires_us, expires_s
    keep_held(s, now)
  end
end

-- usual_check is the usual check of check.lua, at now, of the lease that tab holds at the epoch
-- epoch_s (check.lua's ARGV[2..3]): when the lease is held so, the short answer; otherwise nil, the
-- LEASE_FIELDS it read (read_usual). It changes nothing but the state's retention (keep_usual).
local function usual_check(now, tab, epoch_s)
  local v, held_until = read_usual(now, tab, epoch_s)
  if held_until == nil then
    return nil, v
  end
  keep_usual(v, now, held_until, nil)
  return usual_answer(now, v, v[6], v[7] or '0', v[3] or '0')
end

-- lease_calls is the answer of the function name that makes the usual calls of several leases at
-- once in the lease form (renew_many.lua, check_many.lua), whose arguments are n per lease after
-- ARGV[1]: for lease i, whose keys are keys[2i-1] and keys[2i], begin, then usual (usual_renew or
-- usual_check) with now and the lease's arguments (and those after them, up to four, which it
-- does not take), whose answer, or "DEFER" for nil, is the list's entry i. It raises an error,
-- having made none, unless it is given two keys and n arguments per lease. The store clock is
-- read once, for all of them; begin is given two tables made once and filled anew for each lease
-- (it reads them at once, and nothing keeps them).
local function lease_calls(name, keys, argv, n, usual)
  if #keys < 2 or #keys % 2 ~= 0 or #argv ~= 1 + n * #keys / 2 then
    error('tablease: ' .. name .. ' takes two keys and ' .. n .. ' arguments per lease')
  end
  local now = now_us()
  local out = {}
  local ks, as = {}, {argv[1]}
  for i = 1, #keys / 2 do
    ks[1], ks[2] = keys[2 * i - 1], keys[2 * i]
    begin(ks, as, true)
    local a = n * i - n + 2
    out[i] = usual(now, argv[a], argv[a + 1], argv[a + 2], argv[a + 3]) or 'DEFER'
  end
  return out
end

-- usual_renew is the usual renew of renew.lua, at now, of the lease that tab holds at the epoch
-- epoch_s, with the hidden flag hidden_s and the TTL ttl_s (renew.lua's ARGV[2..5], as strings):
-- when the lease is held so, with that hidden flag and TTL, and the renew brings its expiry no
-- earlier, it writes the expiry and answers the short answer; otherwise it changes nothing, and
-- answers nil, the LEASE_FIELDS it read and, when the lease is held so, its expiry (read_usual).
local function usual_renew(now, tab, epoch_s, hidden_s, ttl_s)
  local v, held_until = read_usual(now, tab, epoch_s)
  if held_until ~= nil and v[3] == hidden_s and v[7] == ttl_s then
    local expires = now + ttl_s * 1000
    if expires >= held_until then
      local expires_s = expiry_string(expires)
      rcall('HSET', KEY_STATE, 'expires_us', expires_s)
      keep_usual(v, now, expires, expires_s)
      return usual_answer(now, v, expires_s, ttl_s, hidden_s)
    end
  end
  return nil, v, held_until
end

-- flush ends the writes of a script: it deletes a handoff that lapsed or whose reservation ended
-- (with its requester's label), appends and publishes the queued records and events, parks the
-- session when it may be and the call changed it (or moves a parked session that may no longer be
-- back to its hash), compacts the hash after drop_holder, and sets how long the state is kept (keep
-- in admin.lua), counting now as its last change when the script changes sessions, appended
-- something or deleted a handoff: the state no longer says when that handoff ended, and now is
-- after it, so the retention that follows its end (keep_until) follows now.
local function flush(s, now)
  local changed = KEY_REPLY ~= nil or #pending > 0 or #audit_pending > 0
  if not changed and s.tab ~= '' and s.ho_tab == '' and not moved_earlier and not dropped
      and not parking and not s.parked then
    -- A call that queued nothing, of a session with a holder and no handoff, in its hash (the
    -- usual renew, check and get): nothing to append, publish, clear, park or compact, so only
    -- its retention, as below, without the steps that would find nothing to do (6 % of the
    -- instructions of the usual renew, scripts/redis-instructions).
    keep_held(s, now)
    return
  end
  SESSION_ENTRY.kept = nil -- a call that may change the session forgets what keep_held learnt
  if s.ho_tab ~= '' and not pending_handoff(s, now) and not reservation(s, now) then
    clear_handoff(s)
    changed = true
  end
  append(s, now)
  local park = s.tab == '' and parkable(s, now) and keep_until(s, now, changed) ~= nil
  if s.parked then
    local current = s.parked
    if not park then
      unpark(s)
      keep(s, now, changed, current, true, false)
    elseif state_written then
      rcall('DEL', KEY_STATE) -- what the call wrote is in s, and goes to the field (keep)
      keep(s, now, changed, current, false, true)
    else
      keep(s, now, changed, current, false, false)
    end
    return
  end
  local current = rcall('PEXPIRETIME', KEY_STATE)
  if parking or (park and current ~= -2 and (dropped or changed)) then
    rcall('DEL', KEY_STATE)
    s.parked = current
    keep(s, now, changed, current, true, true)
    return
  end
  if dropped and current ~= -2 and rcall('OBJECT', 'ENCODING', KEY_STATE) == 'hashtable' then
    local fields = rcall('HGETALL', KEY_STATE)
    rcall('DEL', KEY_STATE)
    rcall('HSET', KEY_STATE, tunpack(fields))
    current = -1
  end
  keep(s, now, changed, current, false, false)
end

-- finish flushes, stores the answer r for the retries of a changing call (KEYS[9], see state.lua),
-- and answers r.
local function finish(s, now, r)
  flush(s, now)
  if KEY_REPLY ~= nil then
    rcall('SET', KEY_REPLY, pack_answer(r), 'PX', REPLY_TTL_S)
  end
  return r
end

-- reserve_handoff settles the handoff request of s as its lease ends at end_us (released at end_us,
-- or expired at its expires_us = end_us), before the script writes that end: when the request was
-- pending at end_us (of this epoch, not lapsed), the free lease is reserved for the requester until
-- end_us plus the request's reserve window, and reserve_handoff answers the requester as events
-- carry it; otherwise it deletes the request and answers nil. A reservation (which only a free
-- lease has) is left alone.
local function reserve_handoff(s, end_us)
  if s.ho_tab == '' or s.ho_reserved then
    return nil
  end
  if s.ho_from_epoch ~= s.epoch or s.ho_until_us <= end_us then
    clear_handoff(s) -- the request lapsed before the end
    return nil
  end
  s.ho_reserved, s.ho_until_us = true, end_us + s.ho_reserve_ms * 1000
  state_set('ho_reserved', '1', 'ho_until_us', int(s.ho_until_us))
  return {tab = s.ho_tab, label = s.ho_label, hidden = s.ho_hidden}
end

-- settle_lease announces the end of a lease that expired by now and was not announced yet, once
-- per epoch: it marks the epoch in ended_epoch, takes the session out of the user's index of held
-- leases, records the expiry in the audit log, at the lease's expires_us, and deletes the holder. A handoff request
-- pending at expires_us becomes a reservation from expires_us (whenever the expiry is announced),
-- and the "expired" event carries its requester. A release and a revoke mark their own epoch.
local function settle_lease(s, now)
  if s.tab ~= '' and s.epoch ~= 0 and s.ended_epoch ~= s.epoch and s.expires_us <= now then
    state_set('ended_epoch', int(s.epoch))
    s.ended_epoch = s.epoch
    index_remove()
    emit({type = 'expired', epoch = int(s.epoch), prev = {tab = s.tab, epoch = int(s.epoch)},
      requester = reserve_handoff(s, s.expires_us), at = int(s.expires_us)})
    record('expire', s.epoch, s.expires_us, 'ptab', s.tab) -- pep: e (admin.lua)
    drop_holder(s)
  end
end
