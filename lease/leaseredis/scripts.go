package leaseredis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// The scripts. Each file starts with a header naming its KEYS and ARGV. The session scripts (every
// script but document.lua, leases.lua, audit.lua and catalog.lua) take the same eight keys (and
// those whose answer is kept for retries a ninth; ping.lua, the readiness probe, the two of the
// lease form, see state.lua) and the same first argument (the engine's options). They are
// one Redis Functions library (library below): four preludes that define what every session
// script uses — state.lua (the keys, the common arguments, the state hash and the lease answer),
// admin.lua (the user's index of held leases and audit log), events.lua (the event log,
// publishing, the lease's expiry and the handoff request it turns into a reservation) and
// presence.lua (presence entries, their expiry, and settle) — then one function per session
// script, whose body is the script's file. Redis runs the preludes once, when it loads the
// library, not on every call. leases.lua, audit.lua and catalog.lua, the reads of the admin
// listing and audit log and the catalog write, are plain scripts (EVALSHA). Every script validates
// its arguments and reads before it writes anything: Redis does not roll back a script that fails
// halfway.
var (
	//go:embed state.lua
	stateLua string
	//go:embed admin.lua
	adminLua string
	//go:embed events.lua
	eventsLua string
	//go:embed presence.lua
	presenceLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed renew_many.lua
	renewManyLua string
	//go:embed release.lua
	releaseLua string
	//go:embed change_many.lua
	changeManyLua string
	//go:embed check.lua
	checkLua string
	//go:embed check_many.lua
	checkManyLua string
	//go:embed get.lua
	getLua string
	//go:embed watch.lua
	watchLua string
	//go:embed settle.lua
	settleLua string
	//go:embed ping.lua
	pingLua string
	//go:embed join.lua
	joinLua string
	//go:embed leave.lua
	leaveLua string
	//go:embed tabs.lua
	tabsLua string
	//go:embed revoke.lua
	revokeLua string
	//go:embed leases.lua
	leasesLua string
	//go:embed audit.lua
	auditLua string
	//go:embed catalog.lua
	catalogLua string

	leasesScript  = redis.NewScript(leasesLua)
	auditScript   = redis.NewScript(auditLua)
	catalogScript = redis.NewScript(catalogLua)
)

// A function is a session script, called with FCALL by its name in the library.
type function struct {
	name  string // in the source
	fcall string // as FCALL names it: <libraryName>_<name>
	body  string
	// allowOOM lets the function run while Redis is at its maxmemory: those that only read, or
	// write what they must announce (an expiry, a tab that left), and renew, which changes only
	// fields the state hash has, so that guards and holders keep working while grants are
	// refused; and revoke, which an operator reaches for in just such an incident, and which
	// writes a few hundred bytes (its audit records and the answer kept for its retries). The
	// others are refused then, with Redis's OOM error.
	allowOOM bool
	// leaseForm lets the function be called with the lease's keys alone (see state.lua).
	leaseForm bool
	// each makes a function of several calls, whose body calls begin for each of them with its
	// keys (renew_many.lua), or has their functions do it (change_many.lua), rather than once
	// with the call's.
	each bool
	// merged, when not nil, is the function that makes several calls of this one at once, which
	// a pipeline sends them in (mergeable in batch.go): the calls with merged.callKeys keys.
	merged *function
	// callKeys is, for a function that makes several calls at once, how many keys each call
	// takes: 2 for renews and checks in the lease form, 9 for changes.
	callKeys int
	// named is true for a function that makes calls of several functions at once: each call is
	// preceded in its arguments by its function's name and the count of its own arguments
	// (change_many.lua).
	named bool
}

var (
	acquireFn = &function{name: "acquire", body: acquireLua, merged: changeManyFn}
	renewFn   = &function{name: "renew", body: renewLua, allowOOM: true, leaseForm: true, merged: renewManyFn}
	// renewManyFn makes the usual renews of several leases in one call (batch.go).
	renewManyFn = &function{name: "renew_many", body: renewManyLua, allowOOM: true, each: true, callKeys: 2}
	releaseFn   = &function{name: "release", body: releaseLua, merged: changeManyFn}
	// changeManyFn makes several calls of the functions that change a session and keep their
	// answers (KEYS[9]) in one call (batch.go). Those functions and it have the same flags: Redis
	// admits or refuses the call as it would each.
	changeManyFn = &function{name: "change_many", body: changeManyLua, each: true, callKeys: 9, named: true}
	checkFn      = &function{name: "check", body: checkLua, allowOOM: true, leaseForm: true, merged: checkManyFn}
	// checkManyFn makes the usual checks of several leases in one call (batch.go).
	checkManyFn = &function{name: "check_many", body: checkManyLua, allowOOM: true, each: true, callKeys: 2}
	getFn       = &function{name: "get", body: getLua, allowOOM: true}
	watchFn     = &function{name: "watch", body: watchLua, allowOOM: true}
	settleFn    = &function{name: "settle", body: settleLua, allowOOM: true}
	joinFn      = &function{name: "join", body: joinLua, merged: changeManyFn}
	leaveFn     = &function{name: "leave", body: leaveLua, merged: changeManyFn}
	tabsFn      = &function{name: "tabs", body: tabsLua, allowOOM: true}
	revokeFn    = &function{name: "revoke", body: revokeLua, allowOOM: true}
	pingFn      = &function{name: "ping", body: pingLua, allowOOM: true, leaseForm: true}

	// library is the source of the library, and libraryName its name: "tablease_" and the start
	// of the SHA-1 of the source, so that instances of different versions sharing a Redis each
	// call their own functions, named <library name>_<function> (function.fcall).
	library, libraryName = newLibrary(acquireFn, renewFn, renewManyFn, releaseFn, checkFn, getFn,
		watchFn, settleFn, joinFn, leaveFn, tabsFn, revokeFn, pingFn, changeManyFn, checkManyFn)
)

// LibraryName is the name of the Redis Functions library this build loads and calls,
// "tablease_" and the start of the SHA-1 of its source: after an upgrade, the libraries FUNCTION
// LIST shows under other names are older versions', for FUNCTION DELETE once no instance of those
// versions runs.
func LibraryName() string { return libraryName }

// newLibrary writes the library of the session scripts fns: the preludes, then one registered
// function per script that clears CALLS_NOW (state.lua), takes the call's keys and arguments
// (begin, in state.lua, told whether the function takes the lease form; a function of several
// calls has it done for each), starts with nothing queued, and runs the script's body, and answers
// it with its name. The functions that a function of several calls makes (merged.named) are also
// kept in CALLS, by name, without the clearing, for it to call (change_many.lua). It sets the
// fcall name of each of fns.
func newLibrary(fns ...*function) (source, name string) {
	var b strings.Builder
	for _, s := range []string{stateLua, adminLua, eventsLua, presenceLua} {
		b.WriteString(s)
		b.WriteString("\n")
	}
	b.WriteString("local CALLS = {}\n")
	for _, f := range fns {
		flags := ""
		if f.allowOOM {
			flags = "'allow-oom'"
		}
		begin := fmt.Sprintf("  begin(keys, argv, %t)\n", f.leaseForm)
		if f.each {
			begin = ""
		}
		begin += "  audit_begin()\n  events_begin()\n"
		kept := ""
		if f.merged != nil && f.merged.named {
			kept = fmt.Sprintf("  CALLS['%s'] = call\n", f.name)
		}
		fmt.Fprintf(&b, "do\n  local function call(keys, argv)\n%s%s\n  end\n%s"+
			"  redis.register_function{function_name = LIBRARY .. '_%s', flags = {%s},\n"+
			"    callback = function(keys, argv) CALLS_NOW = nil return call(keys, argv) end}\nend\n",
			begin, f.body, kept, f.name, flags)
	}
	src := b.String()
	sum := sha1.Sum([]byte(src))
	name = "tablease_" + hex.EncodeToString(sum[:6])
	for _, f := range fns {
		f.fcall = name + "_" + f.name
	}
	return "#!lua name=" + name + "\nlocal LIBRARY = '" + name + "'\n" + src, name
}

// Statuses that the scripts answer first.
const (
	statusOK        = "OK"        // granted, renewed, confirmed, read
	statusHeld      = "HELD"      // acquire: another tab holds the lease
	statusExhausted = "EXHAUSTED" // acquire, revoke: the next epoch would reach 2^53
	statusRetried   = "RETRIED"   // revoke: the retry of a revoke with the same request id, answered as it was
	statusBlocked   = "BLOCKED"   // acquire: an admin blocked grants (until_us says until when)
	statusPending   = "PENDING"   // acquire: a handoff is requested or the lease reserved (until_us: until when)
	statusLost      = "LOST"      // renew, check: the tab does not hold the lease at that epoch
	statusReleased  = "RELEASED"  // release: this call, or the call it retries, ended the lease
	statusKept      = "KEPT"      // release: nothing to release
	statusFull      = "FULL"      // acquire, join, a gone release: the user is at the limit of sessions
	statusGone      = "GONE"      // acquire: the tab said it is gone (release)
	statusDefer     = "DEFER"     // renew, check in the lease form: call again with every key
	statusTabsFull  = "TABS_FULL" // join: the session lists lease.MaxPresence connections
)

// replyLen is the length of a lease answer: {status, held, tab, label, hidden, epoch,
// granted_us, expires_us, ttl_ms, transitions, now_us, until_us, handoff, ho_tab, ho_label,
// ho_hidden, ho_until_us, block_until_us} (see reply in state.lua). An answer with no refusal's
// end, no handoff and no block is short, one string of its first eleven fields (parseShort).
const replyLen = 18

// The handoff field of a lease answer: none, requested or reserved (see lease.HandoffState).
const (
	handoffNone      = 0
	handoffRequested = 1
	handoffReserved  = 2
)

// parseReply turns a script's answer into its status, the lease of key it describes (with the
// handoff in progress and the admin's block in force), and the time at which a refusal ends (until_us: the end of the block of a
// BLOCKED acquire, of the request or reservation of a PENDING one; zero when none).
func parseReply(key lease.Key, v any) (string, lease.Lease, time.Time, error) {
	if a, ok := v.(string); ok {
		status, l, err := parseShort(key, a)
		return status, l, time.Time{}, err
	}
	bad := func() (string, lease.Lease, time.Time, error) {
		return "", lease.Lease{}, time.Time{}, fmt.Errorf("leaseredis: malformed script reply %v", v)
	}
	a, ok := v.([]any)
	if !ok || len(a) != replyLen {
		return bad()
	}
	status, ok1 := a[0].(string)
	tab, ok2 := a[2].(string)
	label, ok3 := a[3].(string)
	hoTab, ok4 := a[13].(string)
	hoLabel, ok5 := a[14].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return bad()
	}
	// held, hidden, epoch, granted_us, expires_us, ttl_ms, transitions, now_us, until_us, handoff,
	// ho_hidden, ho_until_us, block_until_us
	var n [13]int64
	for i, j := range []int{1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17} {
		x, ok := a[j].(int64)
		if !ok || x < 0 {
			return bad()
		}
		n[i] = x
	}
	heldFlag, hidden, epoch, granted, expires, ttlMS, transitions, now := n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]
	ho, hoHidden, hoUntil, blockUntil := n[9], n[10], n[11], n[12]
	if epoch >= lease.MaxEpoch || now == 0 || (blockUntil != 0 && blockUntil <= now) {
		return "", lease.Lease{}, time.Time{}, fmt.Errorf("leaseredis: script reply out of range %v", v)
	}
	switch {
	case ho == handoffNone && (hoTab != "" || hoUntil != 0),
		ho != handoffNone && (hoTab == "" || hoUntil <= now || (ho == handoffRequested) != (heldFlag == 1)),
		ho > handoffReserved:
		return "", lease.Lease{}, time.Time{}, fmt.Errorf("leaseredis: script reply with an impossible handoff %v", v)
	}
	var until time.Time
	if n[8] != 0 {
		until = micros(n[8])
	}
	l := leaseFields{held: heldFlag == 1, tab: tab, label: label, hidden: hidden == 1, epoch: epoch,
		granted: granted, expires: expires, ttlMS: ttlMS, transitions: transitions, now: now}.lease(key)
	if ho != handoffNone {
		l.Handoff = &lease.HandoffState{
			Requester: lease.Holder{TabID: hoTab, Label: hoLabel, Hidden: hoHidden == 1},
			Until:     micros(hoUntil),
			Reserved:  ho == handoffReserved,
		}
	}
	if blockUntil != 0 {
		l.BlockedUntil = micros(blockUntil)
	}
	return status, l, until, nil
}

// parseShort reads the short lease answer a of key, "<status> <held> <now_us> <granted_us>
// <transitions> <expires_us> <ttl_ms> <hidden> <epoch> <tab> <label>" (reply in state.lua): the
// lease as parseReply reads a long one with no refusal's end, no handoff and no block.
func parseShort(key lease.Key, a string) (string, lease.Lease, error) {
	status, rest, ok := strings.Cut(a, " ")
	ok = ok && status != ""
	var n [8]int64 // held, now_us, granted_us, transitions, expires_us, ttl_ms, hidden, epoch
	for i := range n {
		var f string
		var found bool
		f, rest, found = strings.Cut(rest, " ")
		x, err := strconv.ParseInt(f, 10, 64)
		ok = ok && found && err == nil && x >= 0
		n[i] = x
	}
	held, now, granted, transitions, expires, ttlMS, hidden, epoch := n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]
	tab, label, found := strings.Cut(rest, " ")
	switch {
	case !ok || !found || now == 0 || epoch >= lease.MaxEpoch || held > 1 || hidden > 1,
		held == 1 && (tab == "" || granted == 0 || expires <= now || ttlMS == 0),
		held == 0 && (tab != "" || label != "" || hidden != 0):
		return "", lease.Lease{}, fmt.Errorf("leaseredis: malformed script reply %q", a)
	}
	return status, leaseFields{held: held == 1, tab: tab, label: label, hidden: hidden == 1, epoch: epoch,
		granted: granted, expires: expires, ttlMS: ttlMS, transitions: transitions, now: now}.lease(key), nil
}

// leaseFields are the first eleven fields of a lease answer, long or short (reply in state.lua),
// once read.
type leaseFields struct {
	held, hidden          bool
	tab, label            string
	epoch, transitions    int64
	granted, expires, now int64 // store times, in µs
	ttlMS                 int64
}

// lease is the lease of key the fields f tell of: no holder unless held, and no grant and expiry
// times for a lease never granted.
func (f leaseFields) lease(key lease.Key) lease.Lease {
	l := lease.Lease{
		Key:         key,
		Held:        f.held,
		Epoch:       f.epoch,
		TTL:         time.Duration(f.ttlMS) * time.Millisecond,
		Transitions: f.transitions,
		Now:         micros(f.now),
	}
	if f.granted != 0 {
		l.GrantedAt, l.ExpiresAt = micros(f.granted), micros(f.expires)
	}
	if f.held {
		l.Holder = lease.Holder{TabID: f.tab, Label: f.label, Hidden: f.hidden}
	}
	return l
}

// micros is the time of a store clock reading in microseconds, in UTC like every time the engines
// answer.
func micros(us int64) time.Time { return time.UnixMicro(us).UTC() }
