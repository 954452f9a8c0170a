package lease

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// EventType says what changed. The lease types are the "type" of DESIGN §3's `event: lease`; the
// tab types are those of `event: tabs` (see Stream).
type EventType string

const (
	// EventGranted: a free session (never held, released or expired) was granted to Holder at
	// Epoch. Previous is nil, except for the grant that claims a handoff reservation (see
	// ModeHandoff): its Reason is ReasonHandoff and Previous names the tab that handed the lease
	// over and the epoch it held; and for the grant of a new epoch to the holder itself
	// (AcquireRequest.NewEpoch): its Reason is ReasonNewEpoch and Previous is the holder at the
	// epoch it held before.
	EventGranted EventType = "granted"
	// EventReleased: the holder released the lease. Epoch is the epoch that ended, Holder is nil,
	// Previous names the tab that released it. Requester is set when the release reserved the
	// lease for the tab that had requested a handoff (see ModeHandoff).
	EventReleased EventType = "released"
	// EventExpired: the lease reached its ExpiresAt without being renewed. Epoch is the epoch that
	// ended, Holder is nil, Previous names the tab that held it, At is the ExpiresAt. Requester is
	// set when a handoff was requested and pending at ExpiresAt, so that the lease is reserved for
	// the requester (see ModeHandoff).
	EventExpired EventType = "expired"
	// EventTakenOver: another tab took the lease over. Epoch and Holder are the new grant, Previous
	// names the tab and epoch taken over.
	EventTakenOver EventType = "taken_over"
	// EventRevoked: an admin revoked the lease. Epoch is the epoch the revoke minted, Holder is nil,
	// Previous names the holder revoked, Reason is the admin's. A revoke of a free lease produces
	// none. Engines produce it from Admin.Revoke.
	EventRevoked EventType = "revoked"
	// EventHandoffRequested: a tab asked the holder to let go (ModeHandoff). Epoch and Holder are
	// the holder's (the lease is unchanged), Requester is the tab that asked. It comes once per
	// request: repeats of a pending request append nothing.
	EventHandoffRequested EventType = "handoff_requested"
	// EventUpdated: the holder changed its label or hidden flag (by acquiring again or renewing)
	// without a new epoch. Epoch and Holder are the lease after the change; Previous is nil.
	EventUpdated EventType = "updated"

	// EventTabJoined: a tab that was not listed connected to the session's event stream. Tab is
	// the tab as listed.
	EventTabJoined EventType = "joined"
	// EventTabLeft: the last connection of a tab left, or its entry expired because nobody
	// refreshed it (Reason is then ReasonTimeout). Tab is the tab as it was listed.
	EventTabLeft EventType = "left"
	// EventTabChanged: a listed connection of a tab was refreshed with another label or hidden
	// flag. Tab is the tab as listed after the refresh.
	EventTabChanged EventType = "changed"
)

// ReasonTimeout is the Reason of an EventTabLeft whose entry expired unrefreshed (the instance
// that held the connection died or lost the store), as opposed to a clean Leave.
const ReasonTimeout = "timeout"

// ReasonHandoff is the Reason of the EventGranted that claims a handoff reservation.
const ReasonHandoff = "handoff"

// ReasonNewEpoch is the Reason of the EventGranted that gives the holder itself a new epoch
// (AcquireRequest.NewEpoch).
const ReasonNewEpoch = "new_epoch"

// Stream is the name of the SSE event that carries t: "lease" or "tabs".
func (t EventType) Stream() string {
	if t == EventTabJoined || t == EventTabLeft || t == EventTabChanged {
		return "tabs"
	}
	return "lease"
}

// Previous names the holder before a change: the tab and the epoch it held.
type Previous struct {
	TabID string
	Epoch int64
}

// Event is one change of a session, as appended to the session's log. Its fields are those of
// DESIGN §3: `{"type","sessionId","epoch","holder"|null,"previous"|null,"reason","at"}` for lease
// events (sessionId is Key.Session), and Tab for tabs events.
type Event struct {
	// ID is the event's position in its session's log (see EventID): strictly increasing per
	// session, in the order of the changes. It is the SSE id.
	ID string
	// Key is the session the event belongs to. A watch only ever carries events of its own key.
	Key  Key
	Type EventType
	// Epoch and Holder describe the lease after the change (see the EventType constants for
	// released, expired and revoked). Holder is nil when nobody holds the lease after the change.
	// Both are zero for tabs events.
	Epoch  int64
	Holder *Holder
	// Previous is the holder before the change, for released, expired, taken_over and revoked,
	// and for the granted that claims a handoff reservation or gives the holder a new epoch; nil
	// otherwise.
	Previous *Previous
	// Requester is the tab that asked for a handoff: on handoff_requested, and on the released or
	// expired that reserved the lease for it; nil otherwise (see ModeHandoff). The event stream
	// writes it as "requester", a holder object ({tabId, label, hidden}).
	Requester *Holder
	// Reason is free text for revoked (the admin's), ReasonHandoff for the granted that claims a
	// handoff reservation, ReasonNewEpoch for the granted that gives the holder a new epoch, and
	// ReasonTimeout for a tab that left because its entry expired; empty
	// otherwise.
	Reason string
	// At is the store time of the change. For expired, it is the ExpiresAt of the lease (the
	// announcement may come later); for a tab that timed out, the expiry of its entry.
	At time.Time
	// Tab is the tab that joined or left, for tabs events; nil for lease events.
	Tab *Tab
}

// EventID is the position of an event in its session's log, written "<ms>-<seq>" like a Redis
// stream id: Millis is the store clock in milliseconds when the event was appended, Seq tells
// apart the events appended in the same millisecond. An engine gives each new event of a session
// the id Next(last, now), so ids strictly increase per session even when the clock stalls or steps
// back. Ids of different sessions are unrelated.
type EventID struct {
	Millis uint64
	Seq    uint64
}

// ParseEventID reads an id written by String, as a client sends it back in Last-Event-ID. It
// fails with an *InvalidError for anything else (an empty string included).
func ParseEventID(s string) (EventID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	if ok {
		m, err1 := parseDecimal(ms)
		q, err2 := parseDecimal(seq)
		if err1 == nil && err2 == nil {
			return EventID{Millis: m, Seq: q}, nil
		}
	}
	return EventID{}, &InvalidError{Field: "lastEventId", Reason: `must be an event id "<ms>-<seq>"`}
}

// parseDecimal reads an unsigned decimal of at most 20 digits, without sign or leading zero.
func parseDecimal(s string) (uint64, error) {
	if s == "" || len(s) > 20 || (len(s) > 1 && s[0] == '0') || s[0] < '0' || s[0] > '9' {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, 10, 64)
}

// String writes id as "<ms>-<seq>".
func (id EventID) String() string {
	return strconv.FormatUint(id.Millis, 10) + "-" + strconv.FormatUint(id.Seq, 10)
}

// IsZero reports whether id is "0-0", which no event has.
func (id EventID) IsZero() bool { return id == EventID{} }

// Compare returns -1, 0 or +1 as id is before, equal to or after other in a session's log.
func (id EventID) Compare(other EventID) int {
	switch {
	case id.Millis < other.Millis:
		return -1
	case id.Millis > other.Millis:
		return 1
	case id.Seq < other.Seq:
		return -1
	case id.Seq > other.Seq:
		return 1
	}
	return 0
}

// NextEventID is the id of an event appended at now after the event last ("0-0" for none): now in
// milliseconds with Seq 0 when that is after last, and last with Seq+1 otherwise (the clock
// stalled or stepped back), which is what Redis XADD does with "*".
func NextEventID(last EventID, now time.Time) EventID {
	ms := now.UnixMilli()
	if ms > 0 && uint64(ms) > last.Millis {
		return EventID{Millis: uint64(ms)}
	}
	return EventID{Millis: last.Millis, Seq: last.Seq + 1}
}

// Tab is a tab connected to the event stream of a session, as GET …/tabs lists it.
type Tab struct {
	TabID  string
	Label  string
	Hidden bool
	// ConnectedAt is the store time at which the tab's earliest live connection joined. Join
	// ignores what the caller puts here.
	ConnectedAt time.Time
}

// DefaultPresenceTTL is the default time to live of a presence entry: a connection that is not
// refreshed within it (its instance died) is forgotten, and its tab leaves.
const DefaultPresenceTTL = 45 * time.Second

// DefaultEventLogLen is the default number of events a session's log keeps for replay.
const DefaultEventLogLen = 256

// DefaultWatchBuffer is the default number of events a watch buffers for a reader that is behind;
// one more ends the watch with ErrResync. Only the events a reader is behind take memory (an Event
// is 144 bytes; see Watch): 16 is ample for a reader that writes each event out as it comes, and
// one that falls further behind loses nothing but a resync, which replays what it missed from the
// session's log (DefaultEventLogLen).
const DefaultWatchBuffer = 16

// Feed is the event side of an engine: the changes of a session as they happen, after what the
// caller has already seen. Engines that implement it pass the events part of leasetest.Run.
//
// Every change of a session's state (its lease, or the tabs present on it) produces its events in
// the same atomic step that makes the change: there is no change without its event and no event
// without its change. The step appends the events to a bounded per-session log, where each gets an
// id that strictly increases per session (EventID), and hands them to the session's watchers. The
// methods of Engine are unchanged by this: events are their side effect.
//
// What each step appends to the session's log, in this order within the step:
//
//   - Acquire, Renew, Release, Get, Check, Watch, Admin.Revoke and the expiry timer first append
//     EventExpired when the lease has expired and its end was not announced yet, and mark it
//     announced.
//   - Join, Leave, Tabs, Watch and the expiry timer first remove the presence entries that
//     expired, and append EventTabLeft (ReasonTimeout) for each tab whose last entry that was.
//   - Acquire of a free session (never held, released or expired): EventGranted (with Previous
//     and ReasonHandoff when it claims a handoff reservation). Acquire in ModeTakeover of a lease
//     another tab holds: EventTakenOver. Acquire by the holder, in any mode: nothing, or
//     EventUpdated when its label or hidden flag changed; with NewEpoch, EventGranted (with
//     Previous and ReasonNewEpoch). Acquire in ModeHandoff of a lease another
//     tab holds, with no handoff pending: EventHandoffRequested. A refused acquire (a repeated
//     handoff request included): nothing.
//   - Renew: nothing, or EventUpdated when the hidden flag changed. A lost renew: nothing.
//   - Release that ends the lease: EventReleased (with the Requester when it reserves the lease).
//     A retried, stale or refused release: nothing.
//   - Admin.Revoke that ends a lease: EventRevoked. A revoke of a free lease, a block and a
//     retried revoke: nothing.
//   - A handoff request that lapses and a reservation that ends: nothing.
//   - Get, Check, Watch and Tabs: nothing of their own; Admin.ListLeases and Admin.Audit: nothing.
//   - Join: EventTabJoined when the tab was not listed. Leave: EventTabLeft when it removes the
//     tab's last entry.
//
// An expiry changes the state without a call, so it is announced by whoever sees it first: the
// engine's expiry timer, which runs at least for the sessions the engine has watchers for and
// announces each expiry (of the lease, and of presence entries) within a second of it with no call
// needed, or any call that touches the session, before its own event. The step that announces an
// expiry marks the epoch whose end it announced, so every expiry is announced exactly once,
// however many instances share the store.
type Feed interface {
	// Watch starts watching the session key, in one atomic step that reads the state and the
	// position of the session's log and registers the watch, so that nothing happens between the
	// snapshot (or the replay) and the first event of the watch.
	//
	// after is the id of the last event the caller has seen (Last-Event-ID), or empty. When the
	// log still holds the event after names, and so every event after it, the watch is Resumed:
	// Replay holds exactly the events after it. Otherwise (empty, too old, unknown, or the store lost its data)
	// the caller must start again from Snapshot and Tabs, and Replay is empty.
	//
	// The watch ends when ctx is done, when Watch.Close is called, when the engine is closed
	// (*UnavailableError), and with ErrResync when it falls behind (see Watch).
	//
	// Errors: *InvalidError for an invalid key or an after that is not an event id (see
	// ParseEventID); *UnavailableError for store trouble.
	Watch(ctx context.Context, key Key, after string) (*Watch, error)
}

// Presence lists the tabs present on a session (GET …/tabs): connected to its event stream, or
// announced by their client (PUT …/tabs/{tabId}), each through entries of its own. Entries expire
// unless refreshed, so a tab whose instance died or whose client stopped without cleaning up
// leaves within the TTL.
// Engines that implement it pass the presence part of leasetest.Run.
//
// A tab may be connected through several connections (a reconnect overlapping the old
// connection, two instances): the tab is listed while at least one of them is, so an old
// connection that leaves late does not remove a tab that reconnected.
type Presence interface {
	// Join lists tab as connected through conn, an id the caller chooses per connection (an
	// identifier, see ValidateID), until the returned time to live elapses. Joining again with the
	// same conn is the refresh: it extends the entry and records the tab's label and hidden flag.
	// The caller joins again every third of the TTL while the connection lives. A Join that lists
	// a tab that was not listed appends EventTabJoined, so a refresh that comes after its entry
	// expired (the instance lost the store for longer than the TTL) announces the tab again; a
	// refresh of a listed tab appends nothing.
	//
	// seq orders the writes of conn's entry whose requests may arrive out of order (a client's
	// PUT …/tabs/{tabId} and the DELETE sent as its page goes): 0 for none, else a number in [1,
	// MaxEpoch) that the caller increases with each write (see ValidateSeq). The store records,
	// per connection, the highest number of the writes it applied, with the entry while it lives
	// and for the presence TTL after a Leave (a mark: at most MaxPresence per session, the one
	// that lapses first going beyond). A Join whose number is not above the one recorded changes
	// nothing and answers as if applied, the TTL: a later write is applied already. A Join without
	// a number is applied as ever and keeps the number recorded.
	//
	// Errors: *InvalidError for an invalid key, conn, tab id, label or seq; *UnavailableError.
	Join(ctx context.Context, key Key, conn string, tab Tab, seq int64) (ttl time.Duration, err error)
	// Leave removes the entry of conn, and appends EventTabLeft when it was the tab's last. Leaving
	// a conn that is not listed (left or expired already, or another tab's) changes nothing and is
	// not an error.
	//
	// With seq (see Join), a Leave whose number is not above the one recorded for conn changes
	// nothing; otherwise it removes the entry and marks conn with its number for the presence TTL,
	// when the session's presence list holds an entry (conn's own or another's): a Join with a
	// lower number that arrives later then lists nothing. A session that lists no tab keeps no
	// mark. A Leave without a number removes the entry as ever, and marks conn with the number its
	// entry had, if any.
	//
	// Errors: *InvalidError for an invalid key, conn, tab id or seq; *UnavailableError.
	Leave(ctx context.Context, key Key, conn, tabID string, seq int64) error
	// Tabs lists the tabs connected to key, one per tab id: connected since the earliest of its
	// entries, with the label and hidden flag of its latest join. They come in the order they
	// connected, then by tab id; none is nil. Expired entries are never listed.
	//
	// Errors: *InvalidError for an invalid key; *UnavailableError.
	Tabs(ctx context.Context, key Key) ([]Tab, error)
}

// ValidateJoin checks the arguments of Presence.Join.
func ValidateJoin(key Key, conn string, tab Tab, seq int64) error {
	if err := ValidateLeave(key, conn, tab.TabID, seq); err != nil {
		return err
	}
	return ValidateLabel(tab.Label)
}

// ValidateLeave checks the arguments of Presence.Leave.
func ValidateLeave(key Key, conn, tabID string, seq int64) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ValidateID("conn", conn); err != nil {
		return err
	}
	if err := ValidateID("tabId", tabID); err != nil {
		return err
	}
	return ValidateSeq(seq)
}

// ValidateSeq checks the number that orders a connection's presence writes (Presence.Join): 0
// (none) or an integer in [1, MaxEpoch), which JSON and the Redis engine's Lua hold exactly.
func ValidateSeq(seq int64) error {
	if seq < 0 || seq >= MaxEpoch {
		return &InvalidError{Field: "seq", Reason: "must be 0 (none) or an integer in [1, 2^53)"}
	}
	return nil
}
