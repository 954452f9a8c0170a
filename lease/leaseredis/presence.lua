-- presence.lua: the fourth prelude of the session scripts' library (after state.lua, admin.lua and
-- events.lua). It reads the session's presence, announces the tabs whose entries expired
-- (settle_presence) and defines settle, which every session script runs first. It declares no KEYS
-- or ARGV of its own.
--
-- Presence is one entry per connection of a tab to the session's event stream, member
-- "<tabId>/<conn>" (identifiers hold no '/'):
--   KEYS[3]  a sorted set: member → the store time (µs) at which the entry expires
--   KEYS[4]  a hash: member → JSON {"l": label, "h": "1"|"0", "c": connected µs, "r": refreshed µs,
--            "s": the number of the latest ordered write applied (lease.Presence.Join), absent for 0}
--            and, after a Leave, the mark of a connection: member .. "/" (no member ends so) →
--            "<seq> <until µs>", the number of its latest ordered write until the entry would have
--            lapsed (see recorded and put_mark below)
-- An entry is gone at its expiry and after; settle_presence removes it then and announces its tab
-- as left (reason "timeout") when it was the tab's last. join.lua gives both keys a TTL of the
-- presence TTL plus the event log's (LOG_TTL_MS), refreshed on every join: so they may vanish
-- unannounced only once the log that would have told of them expired too.

-- entries reads every entry of the session: {member, tab, expires, label, hidden, connected,
-- refreshed}, in the order of their expiry.
local function entries()
  local z = rcall('ZRANGE', KEY_TABS, '0', '-1', 'WITHSCORES')
  if #z == 0 then
    return {}
  end
  local raw = rcall('HGETALL', KEY_TABINFO)
  local info = {}
  for i = 1, #raw, 2 do
    info[raw[i]] = raw[i + 1]
  end
  local list = {}
  for i = 1, #z, 2 do
    local member = z[i]
    local d = info[member] and cjson.decode(info[member]) or {}
    list[#list + 1] = {
      member = member,
      tab = smatch(member, '^([^/]+)/') or member,
      expires = z[i + 1] + 0,
      label = d.l or '',
      hidden = d.h == '1',
      connected = tonumber(d.c) or 0,
      refreshed = tonumber(d.r) or 0,
    }
  end
  return list
end

-- tab_of is the tab id as listed by the entries of list: connected since the earliest of its
-- entries, with the label and hidden flag of its latest refresh; nil when it has no entry.
local function tab_of(list, id)
  local t, refreshed
  for _, e in lipairs(list) do
    if e.tab == id then
      if t == nil then
        t = {id = id, label = e.label, hidden = e.hidden, connected = e.connected}
        refreshed = e.refreshed
      else
        if e.connected < t.connected then
          t.connected = e.connected
        end
        if e.refreshed >= refreshed then
          refreshed, t.label, t.hidden = e.refreshed, e.label, e.hidden
        end
      end
    end
  end
  return t
end

-- tabs lists the tabs of list, in the order they connected, then by tab id.
local function tabs(list)
  local seen, out = {}, {}
  for _, e in lipairs(list) do
    if not seen[e.tab] then
      seen[e.tab] = true
      out[#out + 1] = tab_of(list, e.tab)
    end
  end
  table.sort(out, function(a, b)
    if a.connected ~= b.connected then
      return a.connected < b.connected
    end
    return a.id < b.id
  end)
  return out
end

-- tabs_reply is the tabs of list as scripts answer them: {tab, label, hidden (1|0), connected µs,
-- …}.
local function tabs_reply(list)
  local out = {}
  for _, t in lipairs(tabs(list)) do
    out[#out + 1] = t.id
    out[#out + 1] = t.label
    out[#out + 1] = t.hidden and 1 or 0
    out[#out + 1] = t.connected
  end
  return out
end

-- tab_json is a tab as events carry it.
local function tab_json(t)
  return {id = t.id, label = t.label, hidden = t.hidden, connected = int(t.connected)}
end

-- mark_seq is the number a mark (a field "<member>/" of KEYS[4], or false) holds at now: 0 once it
-- lapsed.
local function mark_seq(v, now)
  if not v then
    return 0
  end
  local seq, until_us = smatch(v, '^(%d+) (%d+)$')
  if until_us + 0 <= now then
    return 0
  end
  return seq + 0
end

-- put_mark marks member with seq until now + ttl_ms, deleting the marks that lapsed, and the one
-- that lapses first beyond max_marks. Marks live in KEYS[4], which then lives at least as long.
-- Only a leave writes one (a rare call), so reading the whole hash to find the others is cheap.
local function put_mark(member, seq, now, ttl_ms, max_marks)
  local field = member .. '/'
  local raw = rcall('HGETALL', KEY_TABINFO)
  local live, first, first_until = 0, nil, nil
  for i = 1, #raw, 2 do
    local f = raw[i]
    if string.byte(f, -1) == 47 and f ~= field then -- '/': a mark
      local until_us = smatch(raw[i + 1], ' (%d+)$') + 0
      if until_us <= now then
        rcall('HDEL', KEY_TABINFO, f)
      else
        live = live + 1
        if first == nil or until_us < first_until or (until_us == first_until and f < first) then
          first, first_until = f, until_us
        end
      end
    end
  end
  if live >= max_marks then
    rcall('HDEL', KEY_TABINFO, first)
  end
  rcall('HSET', KEY_TABINFO, field, int(seq) .. ' ' .. int(now + ttl_ms * 1000))
  rcall('PEXPIRE', KEY_TABINFO, int(ttl_ms + LOG_TTL_MS))
end

-- settle_presence removes the entries that expired by now, and announces each tab whose last
-- entry that was as left (reason timeout, at the expiry of its last entry), in the order they
-- left, then by tab id.
local function settle_presence(now)
  local first = read_tabs_first() -- kept for deadline, unless the call changes the entries
  if not first or first > now then
    return
  end
  tabs_first = nil -- some expired: removed below
  local expired = rcall('ZRANGEBYSCORE', KEY_TABS, '-inf', int(now))
  local before = entries()
  local gone, at = {}, {} -- the tab ids whose entries expired; the last expiry of each
  local still = {} -- the entries that remain
  for _, e in lipairs(before) do
    if e.expires <= now then
      if at[e.tab] == nil then
        gone[#gone + 1] = e.tab
        at[e.tab] = e.expires
      elseif e.expires > at[e.tab] then
        at[e.tab] = e.expires
      end
    else
      still[#still + 1] = e
    end
  end
  for _, member in lipairs(expired) do
    rcall('ZREM', KEY_TABS, member)
    rcall('HDEL', KEY_TABINFO, member)
  end
  local left = {}
  for _, id in lipairs(gone) do
    if tab_of(still, id) == nil then
      left[#left + 1] = {tab = tab_of(before, id), at = at[id]}
    end
  end
  table.sort(left, function(a, b)
    if a.at ~= b.at then
      return a.at < b.at
    end
    return a.tab.id < b.tab.id
  end)
  for _, l in lipairs(left) do
    emit({type = 'left', tab = tab_json(l.tab), reason = 'timeout', at = int(l.at)})
  end
end

-- settle announces what expired by now and was not announced yet: the lease, then the tabs. Every
-- session script runs it first, right after its validation (a renew only when it announces
-- something: see renew.lua).
local function settle(s, now)
  settle_lease(s, now)
  settle_presence(now)
end
