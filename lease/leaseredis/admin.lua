-- admin.lua: the second prelude of the session scripts' library (after state.lua, before events.lua and
-- presence.lua). It keeps the keys of the user in step with the session: the index of held leases
-- and the audit log, which admins read, and the sessions whose state is kept, which bound the
-- user's sessions (admit, keep). It declares no KEYS or ARGV of its own.
--
-- The index, KEYS[5], is a sorted set of session ids, all with score 0, so that ZRANGEBYLEX pages
-- it in byte order (Admin.ListLeases, see leases.lua). The step that grants a lease adds its
-- session (index_add); the step that ends it (a release, a revoke, or the announcement of its
-- expiry in settle_lease) removes it (index_remove). So the index holds every held lease of the
-- user, and besides only leases that expired and were not announced yet, whose expiries the
-- engine's sweep announces (sweep.go) within a period: it stays about as small as the user's held
-- leases, and a lease held throughout a listing is in it throughout.
--
-- The audit log, KEYS[6], is a stream: one entry per change of a lease of the user, appended by the
-- step that makes the change (record queues it, flush_audit appends it when the script finishes,
-- with the events). Its fields, strings, with only those that apply:
--   s       the session id
--   a       the action: grant, takeover, handoff, release, expire, revoke or block
--           (lease.AuditAction)
--   e       the epoch after the change (for release and expire: the epoch that ended)
--   at      the store time of the change in µs; for expire, the lease's expires_us
--   tab     the acting tab (grant, takeover, handoff, release)
--   adm     the acting admin (revoke, block)
--   ptab    the holder before the change, and its epoch in pep (takeover, handoff: the tab that
--           handed the lease over, expire, revoke). A release's holder before it is its tab and its
--           epoch e, and an expiry's epoch before it is e: those are not written again (pep absent
--           means e; ptab absent in a release means tab), which keeps the two records of most
--           sessions, grant and release, to the same five fields, whose names a stream node then
--           stores once. (Records written before this rule have them; both read alike.)
--   r       the admin's reason (revoke, block)
--   until   the end of a block in µs (block)
--   rid     the id of the admin's request, as its log lines name it (revoke, block), when it had one
-- Entry ids are "<ms>-<seq>" by the rule of lease.NextEventID (the store clock in ms, or the newest
-- entry's id with seq+1 when the clock did not move past it), so a user's records are in exactly
-- the order of the changes, and records of different users compare by the time they were appended,
-- to the millisecond. Each append trims the log to about AUDIT_LEN entries (XADD MAXLEN ~, which
-- removes whole stream nodes, so a few more may stay). An append after which the stream would
-- expire less than AUDIT_RETENTION_MS ms later (PEXPIRETIME, when the library does not know the
-- expiry late enough: flush_audit) drops the entries older than AUDIT_RETENTION_MS ms (XTRIM
-- MINID ~) and sets it to expire AUDIT_RETENTION_MS ms and an eighth of that after the append; the others
-- leave both alone, which spares most appends two commands for one (3 % of the instructions of
-- an acquire or a release: scripts/redis-instructions). So the stream expires between AUDIT_RETENTION_MS ms and
-- an eighth more after its last append, and keeps entries past the retention for at most an eighth
-- of it (audit.lua never reads them): a user's log outlives the user's sessions by about the
-- retention.
--
-- The records of admins (revoke, block: those with adm) are kept in a second stream, KEYS[10],
-- trimmed by length and age and set to expire AUDIT_RETENTION_MS ms later at each of its (rare) appends, and
-- not in KEYS[6]: each takes its id from KEYS[6] (appended there, untrimmed, and deleted at once,
-- which keeps the id taken), so that the ids of both are one sequence, and each stream holds about
-- AUDIT_LEN records of its own kind: the user's own actions never push an admin's record out, nor
-- the other way round. audit.lua reads both, as one log.

local audit_pending -- the audit records of this call not appended yet, in order

-- audit_begin starts a call with no audit record queued: with the empty queue of the last call,
-- most often (a call that failed may have left records queued), rather than a new table.
local function audit_begin()
  if audit_pending == nil or #audit_pending > 0 then
    audit_pending = {}
  end
end

-- index_add lists the session in the user's index of held leases.
local function index_add()
  rcall('ZADD', KEY_SESSIONS, '0', SESSION)
end

-- index_remove takes the session out of the user's index: its lease ended.
local function index_remove()
  rcall('ZREM', KEY_SESSIONS, SESSION)
end

-- record queues an audit record of this session, as the field list of its XADD: the action a, the
-- epoch e and the time at (numbers), then the other fields the record has (above), each a name and
-- a string (numbers written with int), none empty, in this order: tab, adm, ptab, pep, r, until,
-- rid. The callers write them so, rather than a table of fields read out in that order: 2.5 % of
-- Redis's instructions per acquire and release (scripts/redis-instructions).
-- An admin's record is told by adm, then its first field after at.
local function record(a, e, at, ...)
  audit_pending[#audit_pending + 1] = {'s', SESSION, 'a', a, 'e', int(e), 'at', int(at), ...}
end

-- append_audit appends fields to KEYS[6] under id with call (redis.call or redis.pcall), trimming
-- it to about AUDIT_LEN entries, and only when the log exists if known (NOMKSTREAM: the answer is
-- then false when it does not); an admin's record only takes its id there, and trims nothing.
local function append_audit(call, admin, known, id, fields)
  if admin then
    return call('XADD', KEY_AUDIT, id, tunpack(fields))
  elseif known then
    return call('XADD', KEY_AUDIT, 'NOMKSTREAM', 'MAXLEN', '~', AUDIT_LEN_S, id, tunpack(fields))
  end
  return call('XADD', KEY_AUDIT, 'MAXLEN', '~', AUDIT_LEN_S, id, tunpack(fields))
end

-- last_audit_id is the last id KEYS[6] gave, that of a record deleted since (an admin's) included.
local function last_audit_id()
  local info = rcall('XINFO', 'STREAM', KEY_AUDIT)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return info[i + 1]
    end
  end
  error('tablease: XINFO STREAM answered no last-generated-id')
end

-- flush_audit appends the queued records to the audit log, trims it and sets its expiry. Each
-- record's id is "<ms>-*", the store clock's millisecond with the sequence Redis picks (0, or the
-- last id's sequence + 1 within its millisecond): the rule of the ids above, without reading the
-- log. Only when the last id taken is later than the clock (the clock stepped back) does Redis
-- refuse that id; the append then reads the last id taken and continues from it.
-- The log's expiry is read (PEXPIRETIME, above) only when the call does not know it late enough:
-- SESSION_ENTRY.audit_until (state.lua) is the expiry this library last set or read for the log,
-- and while the log exists its expiry is no earlier, since flush_audit only ever moves it later
-- (whatever the retention of the instance) and nothing else sets it. So while audit_until is
-- AUDIT_RETENTION_MS after now or later, the records are appended with NOMKSTREAM, which tells
-- whether the log still exists (deleted, it is appended to anew and its expiry read). That spares
-- an acquire and a release a command each (3,600 of their 291,900 instructions,
-- scripts/redis-instructions).
local function flush_audit(now)
  if #audit_pending == 0 then
    return
  end
  local now_ms = mfloor(now / 1000)
  local until_ms = SESSION_ENTRY.audit_until
  local known = until_ms ~= nil and until_ms >= now_ms + AUDIT_RETENTION_MS
  local ms, seq = now_ms, nil -- the id of the next record: "<ms>-*" while seq is nil
  for _, fields in lipairs(audit_pending) do
    local admin = fields[9] == 'adm'
    if admin then
      known = false -- its XADD makes the log when it is missing
    end
    local id
    if seq == nil then
      id = append_audit(rpcall, admin, known, int(ms) .. '-*', fields)
      if id == false then -- NOMKSTREAM: the log is gone
        known = false
        id = append_audit(rpcall, admin, known, int(ms) .. '-*', fields)
      end
      if ltype(id) == 'table' then -- refused: the last id taken is after the clock
        ms, seq = parse_id(last_audit_id())
      end
    end
    if seq ~= nil then
      seq = seq + 1
      id = int(ms) .. '-' .. int(seq)
      if append_audit(rcall, admin, known, id, fields) == false then
        known = false
        append_audit(rcall, admin, known, id, fields)
      end
    end
    if admin then
      if KEY_AUDIT_ADMIN == nil then
        error('tablease: an admin\'s record without the admins\' audit log')
      end
      rcall('XDEL', KEY_AUDIT, id) -- the stream keeps the id taken
      rcall('XADD', KEY_AUDIT_ADMIN, 'MAXLEN', '~', AUDIT_LEN_S, id, tunpack(fields))
      rcall('XTRIM', KEY_AUDIT_ADMIN, 'MINID', '~', int(mmax(now_ms - AUDIT_RETENTION_MS, 0)))
      rcall('PEXPIRE', KEY_AUDIT_ADMIN, AUDIT_RETENTION_S)
    end
  end
  -- The expiry and the trim by age, only when the log would expire within the retention.
  if not known then
    local current = rcall('PEXPIRETIME', KEY_AUDIT)
    if current < now_ms + AUDIT_RETENTION_MS then
      current = now_ms + AUDIT_RETENTION_MS + mfloor(AUDIT_RETENTION_MS / 8)
      rcall('XTRIM', KEY_AUDIT, 'MINID', '~', int(mmax(now_ms - AUDIT_RETENTION_MS, 0)))
      rcall('PEXPIREAT', KEY_AUDIT, int(current))
    end
    SESSION_ENTRY.audit_until = current
  end
  audit_pending = {}
end

-- admit reports whether the user may have the state s of this session kept: it is kept already
-- (s.exists), the session is in KEYS[7] already (watched: see keep_log in events.lua), or the
-- user has fewer than MAX_SESSIONS sessions there (0: no limit).
-- It forgets the sessions whose state expired: their entries in KEYS[7], and their parked state
-- in KEYS[8] (see state.lua), up to EXPIRED_LIMIT of those at once (the others go with KEYS[8]).
local EXPIRED_LIMIT, EXPIRED_LIMIT_S = 256, '256'
local function admit(s, now)
  if MAX_SESSIONS == 0 or s.exists then
    return true
  end
  local now_ms = int(mfloor(now / 1000))
  local expired = rcall('ZRANGE', KEY_KNOWN, '-inf', now_ms, 'BYSCORE', 'LIMIT', '0', EXPIRED_LIMIT_S)
  if #expired > 0 then
    rcall('HDEL', KEY_FREE, tunpack(expired))
    if #expired < EXPIRED_LIMIT then
      rcall('ZREM', KEY_KNOWN, tunpack(expired))
    else
      rcall('ZREMRANGEBYSCORE', KEY_KNOWN, '-inf', now_ms)
    end
  end
  return rcall('ZSCORE', KEY_KNOWN, SESSION) ~= false or rcall('ZCARD', KEY_KNOWN) < MAX_SESSIONS
end

-- know lists the session in the known set, KEYS[7], until at_ms (ms), and answers the set's
-- expiry: that of its last entry.
local function know(at_ms)
  rcall('ZADD', KEY_KNOWN, int(at_ms), SESSION)
  local last = rcall('ZRANGE', KEY_KNOWN, '-1', '-1', 'WITHSCORES')[2]
  rcall('PEXPIREAT', KEY_KNOWN, last)
  return last
end

-- retention is keep_until (below) once the latest of the ends it counts is known, until_us: IDLE_MS
-- after it, not before keep_us, nil while epoch is not below that time. The usual renew, which makes
-- no state, calls it with its lease's end (renew.lua).
-- (Comparisons and % rather than math.max, math.floor and math.ceil: a call of a library function
-- costs Redis more than the arithmetic, and these run on every call, 3 % of the instructions of
-- the usual renew, scripts/redis-instructions. The times are integers below 2^53, not negative,
-- for which t - t % 1000 is 1000 times math.floor(t / 1000), exactly.)
local function retention(until_us, keep_us, epoch)
  local at_ms = (until_us - until_us % 1000) / 1000 + IDLE_MS
  if keep_us > at_ms * 1000 then
    at_ms = (keep_us - keep_us % 1000) / 1000
    if keep_us % 1000 ~= 0 then
      at_ms = at_ms + 1 -- math.ceil(keep_us / 1000)
    end
  end
  if epoch >= at_ms * 1000 then
    return nil
  end
  return at_ms
end

-- keep_until is when the state of s expires, before keep's slack (below): IDLE_MS after the latest
-- of the lease's end, an admin's block, a handoff's end and, when changed, now; and not before
-- keep_us (the end of the last revoke's retry window, itself a change, whose answer is kept until
-- then, or of a gone tab's window); nil while the last epoch is not below the clock at that time
-- (epochs run ahead of the clock only by the grants of one microsecond): the state is then kept
-- with no expiry.
local function keep_until(s, now, changed)
  local until_us = s.expires_us
  if s.block_until_us > until_us then
    until_us = s.block_until_us
  end
  if s.ho_until_us > until_us then
    until_us = s.ho_until_us
  end
  if changed and now > until_us then
    until_us = now
  end
  return retention(until_us, s.keep_us, s.epoch)
end

-- keep sets when the state of s expires (see state.lua): at keep_until, and up to an eighth of
-- IDLE_MS later: an expiry already set within that eighth is left alone, and a new one is set at
-- its end, so that the renews of a lease move it once in many rather than every time. Only a call
-- that changed the session (changed, or a write of its state) brings the expiry earlier: a later
-- one was set by a change whose time the state may no longer hold (a handoff's end, see flush in
-- events.lua), and a call that reads must not forget it. current is
-- the expiry the state has (PEXPIRETIME's answer for the hash: -1 for none, -2 for no hash; the
-- field's for parked state), or had before flush moved it between the hash and a field (fresh:
-- the state is in a hash or field just written, with no expiry yet). The state is the hash, or the
-- field of s.parked, which keep writes when fresh or rewrite (its values changed), or when its
-- expiry moves. The session's score in the known set, KEYS[7], is the same time; the set and
-- KEYS[8] expire with the latest (and KEYS[8] no earlier than any of its fields).
local function keep(s, now, changed, current, fresh, rewrite)
  local at_ms = keep_until(s, now, changed)
  if at_ms == nil or current == -2 then
    return -- kept with no expiry, or no state
  end
  local slack = KEEP_SLACK_MS
  local moved = current < at_ms or (current > at_ms + slack and (changed or state_written))
  at_ms = moved and at_ms + slack or current
  if s.parked then
    if moved or fresh or rewrite then
      rcall('HSET', KEY_FREE, SESSION, pack_free(s, at_ms))
      s.parked = at_ms
    end
    if fresh and not moved and rcall('PEXPIRETIME', KEY_FREE) < at_ms then
      rcall('PEXPIREAT', KEY_FREE, int(at_ms))
    end
  elseif moved or fresh then
    rcall('PEXPIREAT', KEY_STATE, int(at_ms))
  end
  if moved then
    local last = know(at_ms)
    if KEY_FREE ~= nil then
      rcall('PEXPIREAT', KEY_FREE, last)
    end
  end
end
