-- state.lua: the first prelude of the library of session scripts (scripts.go puts it, then
-- admin.lua, events.lua and presence.lua, before the functions). It takes the keys and the common
-- arguments of each call (begin), reads the state hash and shapes answers; it never writes.
--
-- Every session script is called with the same KEYS, all under the user's hash tag {<sub>} (one
-- Cluster slot), built by the engine from validated identifiers: the session's four keys, then the
-- two keys of its user that the script keeps in step with the session (see admin.lua):
--   KEYS[1]  <prefix>:{<sub>}:lease:<sid>    the state hash (fields below); expires when idle (keep)
--   KEYS[2]  <prefix>:{<sub>}:log:<sid>      the event log, a list (see events.lua)
--   KEYS[3]  <prefix>:{<sub>}:tabs:<sid>     presence: a sorted set of connections (presence.lua)
--   KEYS[4]  <prefix>:{<sub>}:tabinfo:<sid>  presence: the details of each connection (presence.lua)
--   KEYS[5]  <prefix>:{<sub>}:sessions       the user's index of held leases, a sorted set (admin.lua)
--   KEYS[6]  <prefix>:{<sub>}:audit          the user's audit log, a stream (admin.lua)
--   KEYS[7]  <prefix>:{<sub>}:known          the user's sessions whose state is kept (keep, below)
--   KEYS[8]  <prefix>:{<sub>}:free           the state of the user's free sessions, a hash of one
--                                            field per session (parked, below)
-- renew and check may be called first with two keys alone, the lease form: KEYS[1] the state hash
-- and KEYS[2] the user's sessions whose state is kept (KEYS[7] above). In that form they do the
-- usual renew or check, which touches nothing else, and answer "DEFER", having changed nothing,
-- when the call needs more (renew.lua, check.lua); the engine then calls them with every key.
-- Each key costs Redis a string and a check on every call: two instead of eight take about 7 % of
-- the instructions of the usual renew (scripts/redis-instructions).
-- The scripts that change a session (acquire, release, revoke, join, leave; renew.lua says why not
-- renew) get one more:
--   KEYS[9]  <prefix>:{<sub>}:reply:<id>     the answer of this call, for its retries (replayed)
-- and revoke.lua, the one script that records admins' actions, a tenth, and an eleventh when the
-- revoke has a request id:
--   KEYS[10] <prefix>:{<sub>}:audit:admin    the admins' records of the user, a stream (admin.lua)
--   KEYS[11] <prefix>:{<sub>}:revoke:<sid>/<admin>/<request id>
--                                            the answer of the revoke the admin made with that
--                                            request id, for its retries (revoke.lua); "/" is in no
--                                            identifier, so the name is read one way only
-- All get the same ARGV[1], the engine's options: seven decimal integers separated by spaces, read
-- into these names (one argument rather than seven: each argument costs Redis a string on every
-- call, and the seven took about 4 % of the instructions of the usual renew):
--   LOG_LEN             the length of the event log (LTRIM; see events.lua)
--   LOG_TTL_MS          how long the event log is kept after its last event, in milliseconds
--   AUDIT_LEN           the length of the audit log (XADD MAXLEN ~; see admin.lua)
--   AUDIT_RETENTION_MS  how long an audit record is kept, in milliseconds
--   REPLY_TTL_MS        how long the answer of a changing call is kept in KEYS[9], in milliseconds
--   IDLE_MS             the idle retention in milliseconds: how long the state of a session is
--                       kept after the last thing in it ended (keep, below)
--   MAX_SESSIONS        the most sessions a user may have state for, 0 for no limit (admit, below)
-- A script's own arguments follow, from ARGV[2]; its header names them.
--
-- A call that changes a session is answered once: the engine names a new KEYS[9] for each call,
-- and finish (events.lua) stores the answer there for REPLY_TTL_MS, so that when go-redis sends the
-- script again after losing its answer (a connection reset after Redis ran it), the script finds
-- the answer and returns it unchanged (replayed), whatever other calls ran in between, instead of
-- taking effect a second time.
--
-- The state hash, KEYS[1], is kept while the session is in use and for IDLE_MS after the last
-- thing in it ends (keep): its lease, an admin's block, a handoff, the last revoke's retry window,
-- and the last change it had. The epoch counter may go with it, because epochs are floored at the
-- store's clock (lease.NextEpoch): the hash expires only once the clock has passed its last epoch,
-- so the next grant's epoch is higher all the same. KEYS[7] holds each session of the user whose
-- state is kept, scored with the time in ms when it expires.
--
-- A free session is parked: when a call leaves the session with no holder, no handoff, no block in
-- force and no revoke's retry window (parkable), its state moves from the hash to one field of the
-- user's hash KEYS[8], named by the session, and the hash is deleted. A key of its own costs Redis
-- some 270 bytes however little it holds (the key's name, its entries in the key tables and its
-- expiry), a field of a shared hash about its value; most sessions are free most of the time. The
-- field holds what a free session has (pack_free): epoch, granted_us, expires_us, ttl_ms,
-- transitions, rel_tab, rel_epoch, ended_epoch and event_id, and when it expires, in ms (what the
-- hash's own expiry says of a hash: the same as its score in KEYS[7]). load reads it when the
-- session has no hash, as if the hash held it. A call that writes the state of a parked session
-- writes to the hash as ever (state_set), and flush (events.lua) then parks the session again or,
-- when it is no longer parkable (a grant), writes the rest of its state to the hash and deletes
-- the field. A field past its expiry is read as no state; admit deletes those it finds, and KEYS[8]
-- expires with KEYS[7]. A session that is parkable but not parked (it was before this rule, or a
-- block of it ended) works from its hash alike, and is parked by the next call that changes it.
-- Fields:
--   tab, label, hidden   the holder ("1" when hidden); absent once the lease ended and its end was
--                        announced (only the holder of a lease whose expiry is not announced yet
--                        is kept, for that announcement)
--   epoch                the last epoch granted; kept after release and expiry
--   granted_us           store time (µs) when epoch was granted
--   expires_us           store time (µs) when the lease ends, or ended when released; the lease is
--                        held while tab is set and expires_us > now
--   ttl_ms               TTL of the last grant or renew
--   transitions          number of epochs minted (by grants and by admin revokes)
--   rel_tab, rel_epoch   the lease the last release ended, until the next grant, so that a
--                        retried release gets the answer of the first; rel_tab is the tab's mark
--                        (tab_mark), which is its id when the id is short
--   ended_epoch          the expiry marker: the last epoch whose end (release or expiry) was
--                        announced. An expired lease whose epoch is not ended_epoch still has its
--                        "expired" event to come (see settle_lease in events.lua).
--   event_id             the id of the last event appended to the log, "<ms>-<seq>": the next id
--                        must exceed it even when the log was trimmed or expired (events.lua)
--   block_until_us       store time (µs) until which an admin blocked grants (revoke.lua); grants
--                        are refused while it is after now
--   gone                 "<until_us> <mark> …": the tabs that said they are gone (release.lua,
--                        lease.ReleaseRequest.Gone), newest first, at most lease.MaxGone: the store
--                        time (µs) until which each one's acquires are refused, and its mark
--                        (tab_mark); keep_us is then no earlier than the latest, which
--                        keeps the state unparked that long, and tells acquire.lua when to read
--                        this field (gone_window, below): load does not, as a field the hash lacks
--                        costs HMGET a look at every field of a small hash
--   keep_us              store time (µs) until which the hash is kept at least (keep in admin.lua)
--                        and not parked: the end of the retry window of the last revoke with a
--                        request id, as that revoke's answer is kept (KEYS[11]), or of a gone
--                        tab's window, whichever is later
--   ho_tab, ho_label,    the handoff in progress (lease.ModeHandoff), absent when there is none:
--   ho_hidden            the requester, as it asked ("1" when hidden);
--   ho_from_tab,         the holder asked to let go and its epoch (kept here because a release
--   ho_from_epoch        removes tab, and the grant that claims the reservation names them);
--   ho_until_us          store time (µs) when the request lapses, or when the reservation ends;
--   ho_reserved          "0" while requested (the holder still holds the lease), "1" once the
--                        holder let go and the free lease is reserved for the requester;
--   ho_reserve_ms        the reserve window, fixed by the acquire that made the request, so that
--                        every script that ends the lease (release, or the announcement of its
--                        expiry in settle_lease, which any script may run) reserves it alike.
--                        acquire.lua writes them (the request), release.lua and settle_lease turn
--                        a pending request into a reservation or drop it (reserve_handoff in
--                        events.lua), and every grant and revoke deletes them (clear_handoff), as
--                        does the gone release of the requester (release.lua). A request past
--                        ho_until_us, or whose holder no longer holds ho_from_epoch, and a
--                        reservation past ho_until_us or of a held lease, count as none wherever
--                        they are read (pending_handoff, reservation below): a lapse needs no
--                        write, and the next end or grant of the lease deletes the fields.
-- Scripts ignore fields they do not know.
--
-- Numbers: Lua numbers are doubles, exact for integers below 2^53, which bounds epochs and
-- microsecond times alike. They are written with string.format('%d') and answered as integer
-- replies, never through tostring (which would print 1.7e+15). Commands are given them as
-- strings, constants too ('0', not 0): Redis writes a number given to redis.call with "%.17g",
-- about 2,200 instructions each time (2 % of those of an acquire and a release, which gave five,
-- scripts/redis-instructions).

-- The call's keys and arguments, and what begin reads from them: set by begin, first thing in
-- every call (the library's functions run one at a time, so one call's values never meet
-- another's).
local KEYS, ARGV
-- The library functions the calls use most, as local variables: in a function of a Redis
-- Functions library every global variable is looked up in a table that lacks it and then, through
-- its metatable, in Redis's table of globals, two look-ups on every use. begin sets them at the
-- first call (a library's loading run has no library functions), and the calls use them rather
-- than the globals (3 % of the instructions of an acquire and a release, 1 % of the usual renew:
-- scripts/redis-instructions), but redis.call('TIME'), which a test rewrites (storeClock in
-- engines_fuzz_test.go).
local rcall, sformat, tunpack, ltype, mfloor, jencode, rpcall, mmax, lipairs, smatch
local KEY_STATE, KEY_EVENTS, KEY_TABS, KEY_TABINFO, KEY_SESSIONS, KEY_AUDIT, KEY_KNOWN, KEY_FREE
local KEY_REPLY, KEY_AUDIT_ADMIN, KEY_REVOKE
local PREFIX, USER, SESSION
local TAG -- the start of every key of the user: <prefix>:{<sub>}:
local SESSION_ENTRY -- what SESSION_KEYS keeps of the call's session (below)
-- CHANNEL is where every event of every session under the prefix is published (events.lua);
-- CHANNEL_PREFIX is the prefix it was made for.
local CHANNEL, CHANNEL_PREFIX
local LOG_LEN, LOG_TTL_MS, AUDIT_LEN, AUDIT_RETENTION_MS, REPLY_TTL_MS, IDLE_MS, MAX_SESSIONS
-- The same, formatted as the commands take them, once: formatting a number costs Redis about as
-- much as a command's argument handling.
local LOG_TRIM_S, LOG_TTL_S, AUDIT_LEN_S, AUDIT_RETENTION_S, REPLY_TTL_S
-- KEEP_SLACK_MS is an eighth of IDLE_MS, rounded down: how much later than needed keep (admin.lua)
-- sets an expiry, so that it moves once in many renews.
local KEEP_SLACK_MS
-- COMMON is ARGV[1] of the last call, whose values begin read into the names above: an engine
-- gives all its calls the same, so they are read once rather than on every call.
local COMMON
-- state_written is true once the call wrote a field of the state hash (state_set). parking is true
-- once the call decided that flush parks the session, which deletes its hash: writes to the hash
-- are then skipped (state_set, drop_holder), as s holds what they would write.
local state_written, parking

local MAX_EPOCH = 9007199254740992 -- 2^53, exclusive

-- In this library, a decimal number read from Redis (a field, a score, TIME) is made a number by
-- arithmetic, as in `(v or 0) + 0`, rather than by tonumber, which parses the string twice
-- (lua_isnumber, then lua_tonumber): a renew reads nine, and this is 6 % of its instructions
-- (scripts/redis-instructions). Those numbers are written by these scripts, so they parse; one that
-- did not would raise an error, where tonumber would have read it as 0. Arguments (arg_int) keep
-- tonumber, for the error it raises on a bad one.

-- now_us is the store clock in microseconds. Redis 7 replicates the effects of scripts, so a
-- script may read TIME and then write. CALLS_NOW, when set, is the clock of the calls that one
-- function call makes together (change_many.lua), which it reads once for all of them: they run at
-- the same moment. Every function clears it first (scripts.go), so that it never outlives the
-- function call that set it, even one that failed.
local CALLS_NOW
local function now_us()
  if CALLS_NOW then
    return CALLS_NOW
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- int is n written as a decimal integer. A call writes some numbers several times (an acquire
-- its time as the epoch, the grant's time, the event's and the audit record's; its expiry as the
-- lease's and as the next deadline; the store clock's millisecond as the audit record's id and the
-- event's), and each string.format costs about as much as a command's argument (2,000
-- instructions with the string it makes): the strings of up to INTS_MAX numbers written lately
-- are kept, the table starting anew when it is full, which also keeps those that many calls write
-- alike (a TTL, a sequence of 0). An acquire and a release called string.format 27 times between
-- them where they now call it 9 times, 5 % fewer instructions (scripts/redis-instructions).
local INTS, INTS_N, INTS_MAX = {}, 0, 64
local function int(n)
  local s = INTS[n]
  if s == nil then
    s = sformat('%d', n)
    if INTS_N >= INTS_MAX then
      INTS, INTS_N = {}, 0
    end
    INTS[n], INTS_N = s, INTS_N + 1
  end
  return s
end

-- now_string and expiry_string write the store clock and an expiry from it as decimal integers,
-- as int does, for numbers new on almost every call, which int's table would only churn: each
-- keeps the last number it wrote, which the usual renews that renew_many.lua makes at once share
-- (they read the clock once, and most ask for the same TTL), where each string.format cost about
-- 2,000 instructions per renew.
local function last_written()
  local last_n, last_s
  return function(n)
    if n ~= last_n then
      last_n, last_s = n, sformat('%d', n)
    end
    return last_s
  end
end
local now_string, expiry_string = last_written(), last_written()

-- parse_id reads an event or audit id, "<ms>-<seq>"; nil, nil for anything else. The parts of
-- up to IDS_MAX ids made or read lately are kept (note_id; the tables start anew when full): the id
-- of the event a call appends is read again by the session's next call, and by a release that
-- parks the session (pack_free), where each string.match took about 2,500 instructions.
local ID_MS, ID_SEQ, IDS_N, IDS_MAX = {}, {}, 0, 1000

-- note_id keeps ms and seq as the parts of the id id (see parse_id).
local function note_id(id, ms, seq)
  if IDS_N >= IDS_MAX then
    ID_MS, ID_SEQ, IDS_N = {}, {}, 0
  end
  ID_MS[id], ID_SEQ[id], IDS_N = ms, seq, IDS_N + 1
end

local function parse_id(id)
  local ms = ID_MS[id or '']
  if ms ~= nil then
    return ms, ID_SEQ[id]
  end
  local m, s = smatch(id or '', '^(%d+)-(%d+)$')
  if m == nil then
    return nil, nil
  end
  ms, s = m + 0, s + 0
  note_id(id, ms, s)
  return ms, s
end

-- arg_int reads ARGV[i] as an integer in [lo, hi), or raises an error before anything is written.
local function arg_int(i, lo, hi)
  local n = tonumber(ARGV[i])
  if n == nil or n % 1 ~= 0 or n < lo or n >= hi then
    error('tablease: ARGV[' .. i .. '] is not an integer in range')
  end
  return n
end

-- begin takes the keys and arguments of a call and checks them: the keys must be those of one
-- session and its user, the common arguments in range. It raises an error before anything is
-- written otherwise. In the lease form (two keys, see above) the other keys are nil, and
-- LEASE_ONLY is true; only the functions registered with lease_form may be called so.
local LEASE_ONLY
-- SESSION_KEYS maps the state key of each session called lately to what begin reads from it and
-- the keys it checks against it (session_keys): a call finds them with one table look-up where
-- parsing the key and building the names to compare took about 2 % of the instructions of the usual
-- renew, and of an acquire or a release (scripts/redis-instructions). They depend on the key alone,
-- but for kept: what the usual renew or check last learnt of the state hash's expiry (flush in
-- events.lua), which is checked against the hash on every use; and audit_until: what the last
-- append of an audit record learnt of the user's audit log's expiry (flush_audit in admin.lua),
-- which NOMKSTREAM checks on every use. At most SESSION_KEYS_MAX sessions
-- are kept (about 1 KB of the Lua heap each): the table starts anew when it is full.
local SESSION_KEYS, SESSION_KEYS_N, SESSION_KEYS_MAX = {}, 0, 1000

-- session_keys is what SESSION_KEYS keeps of the state key k: {tag, prefix, user, session, and the
-- keys of the session and of its user, the start of its reply keys, the start of its revoke
-- keys, and kept and audit_until (set by flush and flush_audit)}; nil when k is not a state key.
local function session_keys(k)
  local p = SESSION_KEYS[k]
  if p ~= nil then
    return p
  end
  -- The prefix, user and session, read back from the state key (identifiers and the prefix hold
  -- no braces, so it parses one way only, and without backtracking); the other keys must be the
  -- same session's.
  local tag, prefix, user, session = smatch(k, '^(([^{]+):{([^}]+)}:)lease:(.+)$')
  if tag == nil then
    return nil
  end
  p = {tag = tag, prefix = prefix, user = user, session = session, known = tag .. 'known',
    log = tag .. 'log:' .. session, tabs = tag .. 'tabs:' .. session,
    tabinfo = tag .. 'tabinfo:' .. session, sessions = tag .. 'sessions', audit = tag .. 'audit',
    free = tag .. 'free', reply = tag .. 'reply:', audit_admin = tag .. 'audit:admin',
    revoke = tag .. 'revoke:' .. session .. '/'}
  if SESSION_KEYS_N >= SESSION_KEYS_MAX then
    SESSION_KEYS, SESSION_KEYS_N = {}, 0
  end
  SESSION_KEYS[k], SESSION_KEYS_N = p, SESSION_KEYS_N + 1
  return p
end

local function begin(keys, argv, lease_form)
  if rcall == nil then
    rcall, sformat, tunpack, ltype = redis.call, string.format, unpack, type
    mfloor, jencode = math.floor, cjson.encode
    rpcall, mmax, lipairs, smatch = redis.pcall, math.max, ipairs, string.match
  end
  KEYS, ARGV = keys, argv
  state_written, parking = false, false
  LEASE_ONLY = #KEYS == 2
  if LEASE_ONLY and not lease_form then
    error('tablease: this function takes the keys of the session and of its user')
  end
  KEY_STATE = KEYS[1]
  local p = ltype(KEY_STATE) == 'string' and session_keys(KEY_STATE) or nil
  if p == nil then
    error('tablease: KEYS[1] is not a state key')
  end
  TAG, PREFIX, USER, SESSION, SESSION_ENTRY = p.tag, p.prefix, p.user, p.session, p
  if LEASE_ONLY then
    KEY_EVENTS, KEY_TABS, KEY_TABINFO, KEY_SESSIONS, KEY_AUDIT, KEY_REPLY = nil, nil, nil, nil, nil, nil
    KEY_AUDIT_ADMIN, KEY_REVOKE, KEY_KNOWN, KEY_FREE = nil, nil, KEYS[2], nil
    if KEY_KNOWN ~= p.known then
      error('tablease: KEYS[2] is not the sessions kept of the user of KEYS[1]')
    end
  else
    KEY_EVENTS, KEY_TABS, KEY_TABINFO = KEYS[2], KEYS[3], KEYS[4]
    KEY_SESSIONS, KEY_AUDIT, KEY_KNOWN, KEY_FREE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
    KEY_REPLY, KEY_AUDIT_ADMIN, KEY_REVOKE = KEYS[9], KEYS[10], KEYS[11]
    if KEY_EVENTS ~= p.log or KEY_TABS ~= p.tabs or KEY_TABINFO ~= p.tabinfo then
      error('tablease: KEYS[2..4] are not the keys of the session of KEYS[1]')
    end
    if KEY_SESSIONS ~= p.sessions or KEY_AUDIT ~= p.audit or KEY_KNOWN ~= p.known
        or KEY_FREE ~= p.free then
      error('tablease: KEYS[5..8] are not the keys of the user of KEYS[1]')
    end
    if KEY_REPLY ~= nil and (string.sub(KEY_REPLY, 1, #p.reply) ~= p.reply or #KEY_REPLY == #p.reply) then
      error('tablease: KEYS[9] is not a reply key of the user of KEYS[1]')
    end
    if KEY_AUDIT_ADMIN ~= nil and KEY_AUDIT_ADMIN ~= p.audit_admin then
      error('tablease: KEYS[10] is not the admins\' audit log of the user of KEYS[1]')
    end
    if KEY_REVOKE ~= nil then
      local head = p.revoke
      if string.sub(KEY_REVOKE, 1, #head) ~= head or #KEY_REVOKE == #head then
        error('tablease: KEYS[11] is not a revoke of the session of KEYS[1]')
      end
    end
  end
  if PREFIX ~= CHANNEL_PREFIX then
    CHANNEL, CHANNEL_PREFIX = PREFIX .. ':events', PREFIX
  end
  if ARGV[1] ~= COMMON then
    local v = {smatch(ARGV[1] or '', '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')}
    local function common(i, lo)
      local n = tonumber(v[i])
      if n == nil or n < lo or n >= MAX_EPOCH then
        error('tablease: ARGV[1] is not seven integers in range')
      end
      return n
    end
    LOG_LEN, LOG_TTL_MS, AUDIT_LEN = common(1, 1), common(2, 1), common(3, 1)
    AUDIT_RETENTION_MS, REPLY_TTL_MS, IDLE_MS = common(4, 1), common(5, 1), common(6, 1)
    MAX_SESSIONS = common(7, 0)
    KEEP_SLACK_MS = mfloor(IDLE_MS / 8)
    LOG_TRIM_S, LOG_TTL_S, AUDIT_LEN_S = int(-LOG_LEN), int(LOG_TTL_MS), int(AUDIT_LEN)
    AUDIT_RETENTION_S, REPLY_TTL_S = int(AUDIT_RETENTION_MS), int(REPLY_TTL_MS)
    COMMON = ARGV[1]
  end
end

-- A changing call's answer is kept (finish) as it is when it is a string (the short answer of
-- reply, below), and packed otherwise: the long answer of reply, of eighteen fields, in the layout
-- LEASE_PACKED with struct.pack, at half the instructions of cmsgpack.pack, which keeps the others
-- (those of join, leave and revoke, of at most seven fields). Kept answers are read back by the
-- library that kept them (a retry calls the function of the same library), and told apart by their
-- bytes: a short answer and a packed long one start with their status (capitals), and only the
-- packed one holds a zero byte (struct.pack ends its strings with one; no tab id, label or status
-- holds one); a table packed by cmsgpack starts with a byte of 0x80 or more.
local LEASE_PACKED = '>sBssBdddddddBssBdd'
local LEASE_ANSWER_LEN = 18

-- pack_answer is the answer r of a changing call as KEYS[9] keeps it (finish).
local function pack_answer(r)
  if ltype(r) == 'string' then
    return r
  elseif #r == LEASE_ANSWER_LEN then
    return struct.pack(LEASE_PACKED, tunpack(r, 1, LEASE_ANSWER_LEN))
  end
  return cmsgpack.pack(r)
end

-- replayed answers the answer this call already gave, when go-redis sends it again (see above),
-- and nil otherwise. Scripts that change a session call it first after their validation. A replay
-- writes the kept answer again, as it is and with its expiry: Redis's WAIT counts the replicas that
-- received every write of the connection it is sent on, and a replay on a new connection must
-- count only those that received the call it replays (a revoke confirmed on replicas: revokeCall
-- in admin.go).
local function replayed()
  if KEY_REPLY == nil then
    return nil
  end
  local r = rcall('GET', KEY_REPLY)
  if not r then
    return nil
  end
  rcall('SET', KEY_REPLY, r, 'KEEPTTL')
  if string.byte(r, 1) < 128 then
    if not string.find(r, '\0', 1, true) then
      return r -- a short answer
    end
    local a = {struct.unpack(LEASE_PACKED, r)}
    a[LEASE_ANSWER_LEN + 1] = nil -- where struct.unpack stopped
    return a
  end
  return cmsgpack.unpack(r)
end

-- state_set sets fields of the state hash (HSET's arguments), as every write of the state does: it
-- notes that the call wrote the state, which flush reads for a parked session (see above), and
-- writes nothing once the call is parking the session.
local function state_set(...)
  if parking then
    return
  end
  rcall('HSET', KEY_STATE, ...)
  state_written = true
end

-- tab_mark is what rel_tab keeps of the tab whose release ended the last lease: its id when that
-- has at most 9 characters, otherwise "#" and the first 8 hex digits of the id's SHA-1. A tab id
-- may have 128 characters, and a parked session's field (pack_free) must stay within 64 bytes for
-- the user's free hash to stay a compact listpack; rel_tab only has to tell a retried release from
-- another tab's asking to release the same epoch (released_by), for which 32 bits are plenty, and
-- "#" is not a character of ids, so a mark is never the id of a short tab. The marks of the tabs
-- released lately are kept (up to 1,000, the table starting anew when full): a release computed
-- one each time (a SHA-1 of the id), 1 % of the instructions of an acquire and a release
-- (scripts/redis-instructions).
local tab_mark
do
  local marks, n = {}, 0
  tab_mark = function(tab)
    if #tab <= 9 then
      return tab
    end
    local m = marks[tab]
    if m == nil then
      m = '#' .. string.sub(redis.sha1hex(tab), 1, 8)
      if n >= 1000 then
        marks, n = {}, 0
      end
      marks[tab], n = m, n + 1
    end
    return m
  end
end

-- released_by reports whether the last release of s ended tab's lease epoch (rel_tab written as
-- a mark, or as the whole id by versions before the marks).
local function released_by(s, tab, epoch)
  return s.rel_epoch == epoch and (s.rel_tab == tab_mark(tab) or s.rel_tab == tab)
end

-- gone_marks calls f(until_us, mark) for each gone tab of the field gone (above), newest first,
-- until f answers true, and answers whether it did.
local function gone_marks(f)
  for until_us, mark in string.gmatch(rcall('HGET', KEY_STATE, 'gone') or '', '(%d+) (%S+)') do
    if f(until_us + 0, mark) then
      return true
    end
  end
  return false
end

-- gone_window is the end of the window of the gone tab of mark, when it is open at now; nil
-- otherwise.
local function gone_window(mark, now)
  local found = nil
  gone_marks(function(until_us, m)
    if m == mark and until_us > now then
      found = until_us
      return true
    end
    return false
  end)
  return found
end

-- gone_with is the field gone (above) with the window of the tab of mark until until_us: that tab
-- first, then the others whose windows are open at now, at most max tabs in all.
local function gone_with(now, mark, until_us, max)
  local marks = {sformat('%d', until_us), mark}
  gone_marks(function(u, m)
    if u > now and m ~= mark then
      marks[#marks + 1], marks[#marks + 2] = sformat('%d', u), m
    end
    return #marks >= 2 * max
  end)
  return table.concat(marks, ' ')
end

-- pack_free is the field of KEYS[8] that holds the parked state s until at_ms (see above): about
-- 45 bytes and the tab's mark (at most 9), within the 64 bytes up to which Redis keeps a hash as
-- one compact listpack (a value above them makes the user's free hash a hashtable, larger per
-- field, until it is deleted: a session's state stays within them for a lease held up to a day, a
-- thousand grants and the default idle retention). Its numbers are written in hex (a "-" before a
-- negative one), as differences from those they are usually equal or close to (the epoch is the
-- grant's time, the ids and the expiry are counted from the lease's end). Fields, separated by a
-- space: epoch, granted_us - epoch, expires_us - granted_us, ttl_ms, transitions,
-- epoch - rel_epoch and epoch - ended_epoch (each empty for 0), event_id as its ms - end_ms, "-"
-- and its seq (empty for none), at_ms - end_ms, and rel_tab as a mark (tab_mark: a hash written
-- before the marks has the whole id; empty for none), where end_ms is expires_us in whole ms.

-- sign is "-" for a negative n, "" otherwise: pack_free writes |n| in hex after it, in one
-- string.format.
local function sign(n)
  return n < 0 and '-' or ''
end

local function epoch_delta(epoch, v)
  if v == 0 then
    return ''
  elseif v == epoch then
    return '0'
  end
  return sformat('%x', epoch - v) -- rel_epoch and ended_epoch are epochs up to epoch
end

-- PARKED keeps what read_parked reads from each field pack_free wrote lately, by the field, up to
-- PARKED_MAX of them (the table starts anew when full): a session parked by a release is most often
-- read back by its next acquire, which then skips parsing the field (two string.match and a dozen
-- conversions, about 2 % of the instructions of an acquire and a release,
-- scripts/redis-instructions). What pack_free wrote parses back to the same values: the numbers are
-- integers below 2^53, and event ids are written in one form ("%d-%d", append in events.lua).
local PARKED, PARKED_N, PARKED_MAX = {}, 0, 1000

local function pack_free(s, at_ms)
  local end_ms = mfloor(s.expires_us / 1000)
  local abs = math.abs
  local event = ''
  if s.event_id ~= '' then
    local ms, seq = parse_id(s.event_id)
    local d = ms - end_ms
    event = sformat('%s%x-%x', sign(d), abs(d), seq)
  end
  local granted, expires, at = s.granted_us - s.epoch, s.expires_us - s.granted_us, at_ms - end_ms
  local mark = tab_mark(s.rel_tab)
  local v = sformat('%x %s%x %s%x %x %x %s %s %s %s%x %s', s.epoch, sign(granted), abs(granted),
    sign(expires), abs(expires), s.ttl_ms, s.transitions, epoch_delta(s.epoch, s.rel_epoch),
    epoch_delta(s.epoch, s.ended_epoch), event, sign(at), abs(at), mark)
  if PARKED_N >= PARKED_MAX then
    PARKED, PARKED_N = {}, 0
  end
  PARKED[v], PARKED_N = {s.epoch, s.granted_us, s.expires_us, s.ttl_ms, s.transitions, s.rel_epoch,
    s.ended_epoch, s.event_id, mark, at_ms}, PARKED_N + 1
  return v
end

-- from_hex reads a number pack_free wrote: its sign ("-" or "") and its digits.
local function from_hex(sg, digits)
  local n = tonumber(digits, 16)
  return sg == '-' and -n or n
end

-- read_parked reads the parked state of the session into s, which has no state hash: s is then
-- what the hash would hold, s.exists true and s.parked the field's expiry in ms. s is left as it
-- is when the session has no field, or one past its expiry (then it has no state), and in the
-- lease form, which does not read parked state.
local function read_parked(s, now)
  if KEY_FREE == nil then
    return s
  end
  local v = rcall('HGET', KEY_FREE, SESSION)
  if not v then
    return s
  end
  local p = PARKED[v]
  if p ~= nil then
    if p[10] * 1000 <= now then
      return s
    end
    s.epoch, s.granted_us, s.expires_us, s.ttl_ms, s.transitions = p[1], p[2], p[3], p[4], p[5]
    s.rel_epoch, s.ended_epoch, s.event_id, s.rel_tab = p[6], p[7], p[8], p[9]
    s.exists, s.parked = true, p[10]
    return s
  end
  local epoch, gs, granted, es, expires, ttl, transitions, rel, ended, event, as, at, rel_tab =
    smatch(v, '^(%x+) (%-?)(%x+) (%-?)(%x+) (%x+) (%x+) (%x*) (%x*) (%S*) (%-?)(%x+) (.*)$')
  if epoch == nil then
    error('tablease: the parked state of ' .. SESSION .. ' does not parse')
  end
  epoch = tonumber(epoch, 16)
  local granted_us = epoch + from_hex(gs, granted)
  local expires_us = granted_us + from_hex(es, expires)
  local end_ms = mfloor(expires_us / 1000)
  local at_ms = end_ms + from_hex(as, at)
  if at_ms * 1000 <= now then
    return s
  end
  s.epoch, s.granted_us, s.expires_us = epoch, granted_us, expires_us
  s.ttl_ms, s.transitions = tonumber(ttl, 16), tonumber(transitions, 16)
  s.rel_epoch = rel ~= '' and epoch - tonumber(rel, 16) or 0
  s.ended_epoch = ended ~= '' and epoch - tonumber(ended, 16) or 0
  s.event_id = ''
  if event ~= '' then
    local es, ms, seq = smatch(event, '^(%-?)(%x+)%-(%x+)$')
    local event_ms, event_seq = end_ms + from_hex(es, ms), tonumber(seq, 16)
    s.event_id = int(event_ms) .. '-' .. int(event_seq)
    note_id(s.event_id, event_ms, event_seq)
  end
  s.rel_tab = rel_tab
  s.exists, s.parked = true, at_ms
  return s
end

-- LEASE_FIELDS are the fields of the state hash that a holder's renew or check decides and answers
-- with: the lease, keep_us (for keep), and ho_tab, in the order of lease_state. Not the block: a
-- held lease was granted once its block ended (acquire.lua refuses grants while it lasts, and only a
-- revoke, which ends the lease, sets one), so block_until_us is no later than granted_us, and so
-- neither in force nor after the lease's end (reply, keep_until) while the store clock is not
-- before granted_us (read_usual). Most hashes lack the field, and a field the hash lacks costs HMGET
-- a look at each of its fields: 1 % of the instructions of the usual renew
-- (scripts/redis-instructions).
local LEASE_FIELDS = {'tab', 'label', 'hidden', 'epoch', 'granted_us', 'expires_us', 'ttl_ms',
  'transitions', 'keep_us', 'ho_tab'}

-- REST_FIELDS are the other fields that load reads first, in the order of load_rest.
local REST_FIELDS = {'block_until_us', 'rel_tab', 'rel_epoch', 'ended_epoch', 'event_id'}

-- STATE_FIELDS are LEASE_FIELDS then REST_FIELDS: what load reads first. (Built with the language
-- alone: Redis gives a library's loading run no library functions.)
local STATE_FIELDS = {}
for i = 1, #LEASE_FIELDS do
  STATE_FIELDS[i] = LEASE_FIELDS[i]
end
for i = 1, #REST_FIELDS do
  STATE_FIELDS[#LEASE_FIELDS + i] = REST_FIELDS[i]
end

-- found reports whether any of the values v[1..n] of HMGET is a field the hash has.
local function found(v, n)
  for i = 1, n do
    if v[i] then
      return true
    end
  end
  return false
end

-- NO_HANDOFF is the metatable of every state: the fields of a handoff that the state lacks read as
-- those of none, until read_handoff sets them. A Lua table is made with room for the fields of its
-- constructor, rounded up to a power of two, and made anew, at twice the size, when a field beyond
-- them is set: without the seven fields of a handoff, the state of the usual renew and check fits
-- in half the room, which took 1 % of the instructions of the usual renew
-- (scripts/redis-instructions).
local NO_HANDOFF = {__index = {ho_label = '', ho_hidden = false, ho_from_tab = '', ho_from_epoch = 0,
  ho_until_us = 0, ho_reserved = false, ho_reserve_ms = 0}}

-- lease_state is the state read from the values v of LEASE_FIELDS (HMGET answers false for a field
-- the hash lacks): that of a session with no handoff and no block (load_rest reads the block). It
-- keeps v, for load_rest. (state_of makes the state of load, with the rest, and must read the lease
-- alike.)
local function lease_state(v)
  return setmetatable({
    read = v,
    tab = v[1] or '',
    label = v[2] or '',
    hidden = v[3] == '1',
    epoch = (v[4] or 0) + 0,
    granted_us = (v[5] or 0) + 0,
    expires_us = (v[6] or 0) + 0,
    ttl_ms = (v[7] or 0) + 0,
    transitions = (v[8] or 0) + 0,
    block_until_us = 0,
    keep_us = (v[9] or 0) + 0,
    ho_tab = v[10] or '',
  }, NO_HANDOFF)
end

-- state_of is the state read from the values v of STATE_FIELDS: lease_state's, and the rest, in
-- one table made with room for what load's callers add (exists, parked, whole).
local function state_of(v)
  return setmetatable({
    read = v,
    tab = v[1] or '',
    label = v[2] or '',
    hidden = v[3] == '1',
    epoch = (v[4] or 0) + 0,
    granted_us = (v[5] or 0) + 0,
    expires_us = (v[6] or 0) + 0,
    ttl_ms = (v[7] or 0) + 0,
    transitions = (v[8] or 0) + 0,
    keep_us = (v[9] or 0) + 0,
    ho_tab = v[10] or '',
    block_until_us = (v[11] or 0) + 0,
    rel_tab = v[12] or '',
    rel_epoch = (v[13] or 0) + 0,
    ended_epoch = (v[14] or 0) + 0,
    event_id = v[15] or '',
    exists = false,
  }, NO_HANDOFF)
end

-- read_handoff reads the fields of a handoff into s when s has one (ho_tab): most sessions never
-- have one.
local function read_handoff(s)
  if s.ho_tab ~= '' then
    local h = rcall('HMGET', KEY_STATE, 'ho_label', 'ho_hidden', 'ho_from_tab',
      'ho_from_epoch', 'ho_until_us', 'ho_reserved', 'ho_reserve_ms')
    s.ho_label = h[1] or ''
    s.ho_hidden = h[2] == '1'
    s.ho_from_tab = h[3] or ''
    s.ho_from_epoch = (h[4] or 0) + 0
    s.ho_until_us = (h[5] or 0) + 0
    s.ho_reserved = h[6] == '1'
    s.ho_reserve_ms = (h[7] or 0) + 0
  end
  return s
end

-- load_rest completes the state s that lease_state made of read_usual's values, at now, into load's.
local function load_rest(s, now)
  local v = rcall('HMGET', KEY_STATE, tunpack(REST_FIELDS))
  s.block_until_us = (v[1] or 0) + 0
  s.rel_tab = v[2] or ''
  s.rel_epoch = (v[3] or 0) + 0
  s.ended_epoch = (v[4] or 0) + 0
  s.event_id = v[5] or ''
  read_handoff(s)
  if found(s.read, #LEASE_FIELDS) or found(v, #REST_FIELDS) then
    s.exists = true
    return s
  end
  return read_parked(s, now)
end

-- load reads the state of the session at now: its hash, or its parked state when it has no hash.
-- A session that has neither (it never had a lease, or was forgotten) reads as zeros, and exists
-- tells whether it had state (every write of a script sets one of the fields read first).
-- Whether the hash exists is asked first: HMGET of STATE_FIELDS costs Redis about 18,000
-- instructions for a key that does not exist, EXISTS 3,100, and most sessions with no hash are
-- parked (an acquire of a free session, a release's next acquire): 2.6 % of the instructions of an
-- acquire and a release (scripts/redis-instructions), for the 3,100 more of a call that finds one.
-- A call that is most often of a session in its hash (in_hash: a release, whose lease is held)
-- skips the question, and reads the same: 0.7 % of the instructions of an acquire and a release.
local NO_FIELDS = {}
local function load(now, in_hash)
  if not in_hash and rcall('EXISTS', KEY_STATE) == 0 then
    return read_parked(state_of(NO_FIELDS), now)
  end
  local v = rcall('HMGET', KEY_STATE, tunpack(STATE_FIELDS))
  local s = read_handoff(state_of(v))
  if found(v, #STATE_FIELDS) then
    s.exists = true
    return s
  end
  return read_parked(s, now)
end

local function held(s, now)
  return s.tab ~= '' and s.expires_us > now
end

local function held_by(s, now, tab, epoch)
  return held(s, now) and s.tab == tab and s.epoch == epoch
end

-- read_usual reads LEASE_FIELDS for the usual renew and check, and answers their values v
-- (strings, false for a field the hash lacks) and, when they are load's for a lease that tab holds
-- at the epoch epoch_s at now with no handoff, the lease's expires_us; nil otherwise. A lease is
-- held so when it is held by tab at that epoch and now is no earlier than its grant, so that the
-- block it did not read is neither in force nor later than the lease's end (see LEASE_FIELDS). The
-- tab and the epoch are compared as the strings the hash holds: an argument that equals the epoch
-- the scripts wrote ('%d') is that epoch, and valid; the caller validates any other (arg_int).
-- Deciding on the strings, without making lease_state's table, took the usual renew from 92,700
-- instructions to 77,500 (scripts/redis-instructions).
local function read_usual(now, tab, epoch_s)
  local v = rcall('HMGET', KEY_STATE, tunpack(LEASE_FIELDS))
  if v[1] == tab and v[4] == epoch_s and not v[10] and now >= (v[5] or 0) + 0 then
    local expires_us = (v[6] or 0) + 0
    if expires_us > now then
      return v, expires_us
    end
  end
  return v, nil
end

-- pending_handoff reports whether a handoff request of the lease s is pending at now: requested,
-- not lapsed, and of the holder's epoch, which still holds the lease.
local function pending_handoff(s, now)
  return s.ho_tab ~= '' and not s.ho_reserved and held(s, now) and s.ho_from_epoch == s.epoch
    and s.ho_until_us > now
end

-- reservation reports whether the free lease s is reserved for a requester at now.
local function reservation(s, now)
  return s.ho_tab ~= '' and s.ho_reserved and not held(s, now) and s.ho_until_us > now
end

-- usual_answer is the short answer (see reply) of the usual renew and check, at now, of a lease
-- held with no handoff and no block in force, whose LEASE_FIELDS were v (as read_usual answers
-- them) and whose expiry, TTL and hidden flag are now expires_s, ttl_s and hidden_s: the numbers as
-- the hash holds them ('%d').
local function usual_answer(now, v, expires_s, ttl_s, hidden_s)
  return 'OK 1 ' .. now_string(now) .. ' ' .. (v[5] or '0') .. ' ' .. (v[8] or '0') .. ' ' ..
    expires_s .. ' ' .. ttl_s .. ' ' .. hidden_s .. ' ' .. v[4] .. ' ' .. v[1] .. ' ' .. (v[2] or '')
end

-- reply is the lease part of every answer: {status, held, tab, label, hidden, epoch, granted_us,
-- expires_us, ttl_ms, transitions, now_us, until_us, handoff, ho_tab, ho_label, ho_hidden,
-- ho_until_us, block_until_us}. The holder fields are empty unless the lease is held; until_us is
-- when a refusal ends (the block of a "BLOCKED" acquire, the request or reservation of a "PENDING"
-- one), 0 otherwise. handoff is the handoff in progress at now: 0 none, 1 requested, 2 reserved;
-- the requester and the Until of the handoff follow it ('', '', 0, 0 when there is none).
-- block_until_us is the end of the admin's block while it is in force at now, 0 otherwise. settle
-- must have run at now, so that an expiry has turned its request into a reservation.
-- When until_us, handoff and block_until_us are all 0 (no handoff, no block: the usual answer),
-- the answer is short: one string of its first eleven fields, "<status> <held> <now_us>
-- <granted_us> <transitions> <expires_us> <ttl_ms> <hidden> <epoch> <tab> <label>", the label last,
-- as it is (spaces and all; a tab id has none), the numbers in decimal; the engine reads the seven
-- left out as zeros. Each field of an answer costs Redis about 650 instructions to send (and the
-- engine an allocation to read): one string rather than eleven fields took the usual check from
-- 89,100 instructions to 68,200, and an acquire and a release from 316,300 to 307,100
-- (scripts/redis-instructions).
local function reply(status, s, now, until_us)
  until_us = until_us or 0
  local block = s.block_until_us > now and s.block_until_us or 0
  local ho, ho_tab, ho_label, ho_hidden, ho_until = 0, '', '', 0, 0
  if s.ho_tab ~= '' and (pending_handoff(s, now) or reservation(s, now)) then
    ho = s.ho_reserved and 2 or 1
    ho_tab, ho_label, ho_hidden, ho_until = s.ho_tab, s.ho_label, s.ho_hidden and 1 or 0,
      s.ho_until_us
  elseif until_us == 0 and block == 0 then
    local h = held(s, now)
    return status .. (h and ' 1 ' or ' 0 ') .. int(now) .. ' ' .. int(s.granted_us) .. ' ' ..
      int(s.transitions) .. ' ' .. int(s.expires_us) .. ' ' .. int(s.ttl_ms) ..
      ((h and s.hidden) and ' 1 ' or ' 0 ') .. int(s.epoch) .. ' ' .. (h and s.tab or '') .. ' ' ..
      (h and s.label or '')
  end
  if held(s, now) then
    return {status, 1, s.tab, s.label, s.hidden and 1 or 0, s.epoch, s.granted_us, s.expires_us,
      s.ttl_ms, s.transitions, now, until_us, ho, ho_tab, ho_label, ho_hidden, ho_until, block}
  end
  return {status, 0, '', '', 0, s.epoch, s.granted_us, s.expires_us, s.ttl_ms, s.transitions, now,
    until_us, ho, ho_tab, ho_label, ho_hidden, ho_until, block}
end
