package leaseredis

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// The engine is a lease.Store: its Feed and Presence are here, its Admin in admin.go.
var _ lease.Store = (*Engine)(nil)

// subscriptionBuffer is the size of go-redis's buffer between the subscription's connection and
// the engine's reader. The reader never blocks for long (it hands events to watches without
// waiting), so the buffer only absorbs bursts; go-redis would drop a message only after a minute
// of a full buffer.
const subscriptionBuffer = 1024

// settleRetry is how long a settle timer waits before it tries again after a failed script.
const settleRetry = 500 * time.Millisecond

// errNotSubscribed is the store error of a Watch that could not get the subscription confirmed
// within OpTimeout.
var errNotSubscribed = errors.New("leaseredis: the event subscription was not confirmed in time")

// watched is a session this engine has watchers for. Its fields are protected by Engine.mu.
type watched struct {
	watchers watcherSet
	// timer runs the settle script at the session's next deadline; nil until there is one.
	timer *time.Timer
	// dueUS is the store time (µs) timer is set for; 0 when it is not set, and math.MaxInt64
	// while it waits to retry a failed settle (any deadline learned meanwhile replaces it).
	dueUS int64
}

// watcherSet is the watchers of a session: most sessions have one, which is kept without a map
// (a map of one entry costs an idle stream some 140 bytes).
type watcherSet struct {
	one  *watcher              // the watcher while the set has only ever had one
	many map[*watcher]struct{} // every watcher once a second one came
}

func (ws *watcherSet) add(x *watcher) {
	switch {
	case ws.many != nil:
		ws.many[x] = struct{}{}
	case ws.one == nil:
		ws.one = x
	default:
		ws.many = map[*watcher]struct{}{ws.one: {}, x: {}}
		ws.one = nil
	}
}

// remove takes x out of the set; removing while all ranges over it is allowed.
func (ws *watcherSet) remove(x *watcher) {
	if ws.one == x {
		ws.one = nil
	}
	delete(ws.many, x)
}

func (ws *watcherSet) has(x *watcher) bool {
	if ws.one != nil {
		return ws.one == x
	}
	_, ok := ws.many[x]
	return ok
}

func (ws *watcherSet) len() int {
	if ws.one != nil {
		return 1
	}
	return len(ws.many)
}

// all ranges over the watchers, in no particular order.
func (ws *watcherSet) all() iter.Seq[*watcher] {
	return func(yield func(*watcher) bool) {
		if ws.one != nil {
			yield(ws.one)
			return
		}
		for x := range ws.many {
			if !yield(x) {
				return
			}
		}
	}
}

func (s *watched) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.dueUS = 0
}

// watcher is the engine's side of one watch. Its fields are protected by Engine.mu.
type watcher struct {
	sender *lease.WatchSender
	// ready is false while the watch script runs. The events received meanwhile wait in pending
	// (at most the watch buffer of the newest; lost is the id of the newest one dropped), to be
	// sorted out against the script's position when it answers.
	ready   bool
	pending []heldEvent
	lost    lease.EventID
	// last is the id of the newest event the watch has: its position, then each event delivered.
	// Events at or before it are never delivered.
	last lease.EventID
	// behind is the newest event of the session's log, as a settle read it, while the watch has
	// not had it, and behindAt when the settle read it; zero when the watch had every event the
	// last settle found (see fire).
	behind   lease.EventID
	behindAt time.Time
	// release lets go of the sharded subscription of the watch's user (see subscribeShard); nil
	// elsewhere. live reports, with Engine.mu held, whether the subscription the watch waited for
	// is still the one that brings its events (see subscribe).
	release func()
	live    func() bool
}

// heldEvent is an event of the subscription: its id, the id of the session's event before it
// (prev, when hasPrev: messages of libraries before p carry none), and the event.
type heldEvent struct {
	id      lease.EventID
	prev    lease.EventID
	hasPrev bool
	ev      lease.Event
}

// Watch implements lease.Feed.
//
// The watch is registered among the engine's watchers, its incoming events held aside, before
// watch.lua reads the lease, the tabs and the log's position (announcing an expiry first) in one
// step; then the held events after the position are delivered and the rest dropped. The one
// subscription is confirmed before any watcher is registered, so every event appended after the
// position reaches the watch, once. A session that never had a lease starts from a free lease at
// epoch 0.
func (e *Engine) Watch(ctx context.Context, key lease.Key, after string) (*lease.Watch, error) {
	const op = "watch"
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if after != "" {
		if _, err := lease.ParseEventID(after); err != nil {
			return nil, err
		}
	}
	if e.closed.Load() {
		return nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	var (
		x      *watcher
		w      *lease.Watch
		sender *lease.WatchSender
	)
	// A subscription may end between its confirmation and the watch's registration, which would
	// not end the watch (it was not registered yet): the watch would wait on no subscription.
	// register refuses it then, and the watch subscribes again.
	for try := 0; ; try++ {
		release, live, err := e.subscribe(ctx, key.User)
		if err != nil {
			return nil, err
		}
		x = &watcher{release: release, live: live}
		w, sender = lease.NewWatch(ctx, key, e.watchBuffer, func() { e.forget(key, x) })
		x.sender = sender
		err = e.register(key, x)
		if err == nil {
			break
		}
		w.Close()
		if !errors.Is(err, errSubscriptionEnded) || try == 2 {
			return nil, &lease.UnavailableError{Op: op, Err: err}
		}
	}
	v, err := e.eval(ctx, op, watchFn, key, after)
	if err != nil {
		w.Close()
		return nil, err
	}
	r, err := parseWatch(key, v)
	if err != nil {
		w.Close()
		return nil, &lease.UnavailableError{Op: op, Err: err}
	}
	if r.full {
		w.Close()
		return nil, &lease.SessionLimitError{Limit: e.perUser}
	}
	w.Snapshot, w.Tabs, w.Position, w.Resumed, w.Replay = r.lease, r.tabs, r.position, r.resumed, r.replay
	e.start(key, x, r.position, r.lease.Now.UnixMicro(), r.next)
	return w, nil
}

// subscribe makes sure the engine receives the events of user: on a Redis Cluster through the
// sharded subscription of the user's shard (subscribeShard), which the watch holds until it calls
// release; elsewhere through the engine's one subscription, confirmed on first use (release is
// nil). live reports, with e.mu held, whether that subscription still stands: the sharded one is
// still the user's, the engine's was not replaced (replaceSubscription). It waits at most
// OpTimeout.
func (e *Engine) subscribe(ctx context.Context, user string) (release func(), live func() bool, err error) {
	if cluster, ok := e.client.(*redis.ClusterClient); ok {
		release, u, err := e.subscribeShard(ctx, cluster, user)
		if err != nil {
			return nil, nil, err
		}
		return release, func() bool { return e.users[user] == u }, nil
	}
	subscribed, err := e.subscribeAll(ctx)
	if err != nil {
		return nil, nil, err
	}
	return nil, func() bool { return e.subscribed == subscribed }, nil
}

// subscribeAll makes sure the engine's one subscription, to the prefix's channel, is confirmed,
// starting it on first use, and answers its confirmation channel (Engine.subscribed). It waits at
// most OpTimeout.
func (e *Engine) subscribeAll(ctx context.Context) (chan struct{}, error) {
	const op = "watch"
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	if e.pubsub == nil {
		e.heartbeat = "tablease-heartbeat " + rand.Text() // before the reader that reads it
		e.startSubscription()
		e.timers.Add(1)
		go e.beat()
	}
	subscribed := e.subscribed
	e.mu.Unlock()

	select {
	case <-subscribed:
		return subscribed, nil
	default:
	}
	timer := time.NewTimer(e.opTimeout)
	defer timer.Stop()
	select {
	case <-subscribed:
		return subscribed, nil
	case <-ctx.Done():
		return nil, &lease.UnavailableError{Op: op, Err: ctx.Err()}
	case <-e.ctx.Done():
		return nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	case <-timer.C:
		return nil, &lease.UnavailableError{Op: op, Err: errNotSubscribed}
	}
}

// startSubscription starts the engine's one subscription and its reader. e.mu must be held.
func (e *Engine) startSubscription() {
	// Without a channel, Subscribe does no I/O: read subscribes, and go-redis re-subscribes after
	// every reconnect.
	e.pubsub = e.client.Subscribe(e.ctx)
	e.subscribed, e.readerDone = make(chan struct{}), make(chan struct{})
	go e.read(e.pubsub, e.subscribed, e.readerDone)
}

// heartbeatEvery is how often an engine publishes its heartbeat on the prefix's channel.
const heartbeatEvery = time.Second

// beat publishes the engine's heartbeat every heartbeatEvery, until Close, and replaces the
// subscription when a heartbeat published successfully was not heard back in time while the
// latest one was published too: the subscription's connection is to a node that no longer gets
// what is published, as after a Sentinel failover whose old primary still runs (go-redis moves
// its commands to the new primary, not a subscription), until that node is demoted, or for good
// when the sentinels cannot reach it. The watches then start over (lease.ErrResync) on the new
// subscription. While the store does not take the heartbeat (an outage) nothing is judged: go-redis
// re-subscribes by itself once it answers.
func (e *Engine) beat() {
	defer e.timers.Done()
	lost := e.silenceLimit()
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	var waiting time.Time // when a heartbeat not heard back yet was sent; zero when none
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-tick.C:
		}
		e.mu.Lock()
		ps, subscribed := e.pubsub, e.subscribed
		e.mu.Unlock()
		select {
		case <-subscribed:
		default:
			waiting = time.Time{} // not confirmed yet: subscribeAll's timeout judges it
			continue
		}
		if !waiting.IsZero() && e.heard.Load() >= waiting.UnixNano() {
			waiting = time.Time{}
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(e.ctx, e.opTimeout)
		err := e.client.Publish(ctx, e.channel(), e.heartbeat).Err()
		cancel()
		switch {
		case err != nil:
			waiting = time.Time{}
		case waiting.IsZero():
			waiting = sent
		case time.Since(waiting) > lost:
			quiet := waiting // since when it heard nothing: its last heartbeat heard, if any
			if heard := e.heard.Load(); heard != 0 {
				quiet = time.Unix(0, heard)
			}
			e.replaceSubscription(ps, time.Since(quiet).Round(10*time.Millisecond))
			waiting = time.Time{}
		}
	}
}

// replaceSubscription closes ps, when it is still the engine's subscription, starts a new one,
// and ends every local watch with lease.ErrResync: what was published meanwhile was not heard.
// silence is how long the subscription heard nothing: since it last heard a heartbeat.
func (e *Engine) replaceSubscription(ps *redis.PubSub, silence time.Duration) {
	e.mu.Lock()
	if e.shut || e.pubsub != ps {
		e.mu.Unlock()
		return
	}
	e.startSubscription()
	e.mu.Unlock()
	_ = ps.Close()
	if e.onResubscribe != nil {
		e.onResubscribe(silence)
	}
	e.resync()
}

// read is the subscription's reader, the one goroutine that receives the events of every session
// under the prefix and hands them to the local watchers. The first confirmation of the
// subscription closes subscribed; every later one follows a reconnect, during which messages were
// lost, so it ends every local watch with lease.ErrResync. It returns when the subscription is
// closed (by Close).
func (e *Engine) read(ps *redis.PubSub, subscribed, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(e.ctx, e.opTimeout)
	// A failure is retried by go-redis, which keeps the channel and subscribes on its next
	// connection.
	_ = ps.Subscribe(ctx, e.channel())
	cancel()
	confirmed := false
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelSize(subscriptionBuffer)) {
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			if !confirmed {
				confirmed = true
				close(subscribed)
				continue
			}
			e.resync()
		case *redis.Message:
			if m.Payload == e.heartbeat {
				e.heard.Store(time.Now().UnixNano())
				continue
			}
			e.deliver(m.Payload)
		}
	}
}

// resync ends every local watch with lease.ErrResync: the subscription was lost for a while.
func (e *Engine) resync() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut {
		return
	}
	for key, s := range e.sessions {
		for x := range s.watchers.all() {
			x.sender.End(lease.ErrResync)
		}
		s.stopTimer()
		delete(e.sessions, key)
	}
}

// errSubscriptionEnded is why a Watch subscribes again: the subscription it waited for ended
// before the watch was registered.
var errSubscriptionEnded = errors.New("leaseredis: the subscription ended before the watch was registered")

// register adds x to the watchers of key, not ready yet. It answers ErrClosed after Close, and
// errSubscriptionEnded when the subscription x waited for ended meanwhile (its watchers ended
// before x was one of them).
func (e *Engine) register(key lease.Key, x *watcher) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut {
		return ErrClosed
	}
	if x.live != nil && !x.live() {
		return errSubscriptionEnded
	}
	s := e.sessions[key]
	if s == nil {
		s = &watched{}
		e.sessions[key] = s
	}
	s.watchers.add(x)
	return nil
}

// start makes x ready once its watch script answered position: it delivers the held events after
// position, or ends the watch with lease.ErrResync when one of them was dropped, and schedules the
// session's settle timer at next (store µs, read at nowUS; 0 for none), or sooner to keep its log
// (nextSettle).
func (e *Engine) start(key lease.Key, x *watcher, position string, nowUS, next int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[key]
	if s == nil {
		return
	}
	if !s.watchers.has(x) {
		return // ended meanwhile
	}
	var pos lease.EventID
	if position != "" {
		pos, _ = lease.ParseEventID(position) // checked by parseWatch
	}
	held := x.pending
	x.ready, x.pending, x.last = true, nil, pos
	if x.lost.Compare(pos) > 0 {
		// Events after the position were dropped while the script ran: a gap.
		x.sender.End(lease.ErrResync)
		e.drop(key, s, x)
		return
	}
	for _, h := range held {
		if ended, missed := e.send(key, s, x, h); ended {
			if missed {
				e.missed(key)
			}
			return
		}
	}
	e.schedule(key, s, nowUS, e.nextSettle(nowUS, next))
}

// keepLogEvery is the shortest time between two runs of the settle script that keep a watched
// session's log (nextSettle), whatever EventLogTTL.
const keepLogEvery = 100 * time.Millisecond

// nextSettle is when the settle timer of a watched session must fire, given its next deadline next
// (store µs; 0 for none) as read at nowUS: at next, or sooner, a tenth of the event log's TTL
// after nowUS (at least keepLogEvery), since the settle script keeps the log of a watched session
// (settle.lua), which would expire otherwise after a quiet spell and log no more events. A tenth,
// so that the log outlives the last watcher by at least nine tenths of its TTL; a settle script
// a minute per watched session costs Redis less than the presence refreshes of its streams.
func (e *Engine) nextSettle(nowUS, next int64) int64 {
	keep := nowUS + max(e.logTTL/10, keepLogEvery).Microseconds()
	if next > 0 && next < keep {
		return next
	}
	return keep
}

// forget removes x from the watchers of key, if it is still there: the caller closed the watch or
// its context ended.
func (e *Engine) forget(key lease.Key, x *watcher) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.sessions[key]; s != nil {
		if s.watchers.has(x) {
			e.drop(key, s, x)
		}
	}
}

// drop removes x from s, and forgets s (stopping its timer) when it was its last watcher. e.mu
// must be held.
func (e *Engine) drop(key lease.Key, s *watched, x *watcher) {
	if x.release != nil {
		x.release()
	}
	s.watchers.remove(x)
	if s.watchers.len() == 0 {
		s.stopTimer()
		delete(e.sessions, key)
	}
}

// send hands h to x: held aside while x is not ready, delivered when it is after the last event x
// has, dropped otherwise. It answers whether x has ended and was dropped, and whether because x
// missed the events between its last and h: h names another event before it (events.lua
// publishes only the events of sessions with a log, and a watched session's log may have gone
// missing), and x ends with lease.ErrResync. e.mu must be held.
func (e *Engine) send(key lease.Key, s *watched, x *watcher, h heldEvent) (ended, missed bool) {
	if !x.ready {
		if len(x.pending) >= e.watchBuffer {
			x.lost = x.pending[0].id
			x.pending = append(x.pending[:0], x.pending[1:]...)
		}
		x.pending = append(x.pending, h)
		return false, false
	}
	if h.id.Compare(x.last) <= 0 {
		return false, false
	}
	if h.hasPrev && h.prev != x.last {
		x.sender.End(lease.ErrResync)
		e.drop(key, s, x)
		return true, true
	}
	x.last = h.id
	if !x.sender.Send(h.ev) {
		e.drop(key, s, x)
		return true, false
	}
	return false, false
}

// missed tells Options.OnMissedEvents that watches of key missed events and ended. e.mu must be
// held.
func (e *Engine) missed(key lease.Key) {
	if e.onMissedEvents != nil {
		e.onMissedEvents(key)
	}
}

// deliver handles one message of the subscription: an event, handed to the watchers of its
// session, and the session's next deadline, for its settle timer. Messages of sessions this engine
// does not watch are ignored, and so are messages that are not JSON (they are not the engine's);
// an event of a watched session whose id (or the id of the event before it) cannot be read ends
// its watches with lease.ErrResync.
func (e *Engine) deliver(payload string) {
	if !e.watching(payload) {
		return
	}
	var m wireMessage
	if err := json.Unmarshal([]byte(payload), &m); err != nil {
		return
	}
	key := lease.Key{User: m.User, Session: m.Session}
	var (
		h   heldEvent
		bad error
	)
	if m.Event != nil {
		if h.id, bad = lease.ParseEventID(m.ID); bad == nil {
			h.ev = m.Event.event(key, m.ID)
		}
		if m.Prev != nil && bad == nil {
			h.hasPrev = true
			if *m.Prev != "" { // "": the session had no event before
				h.prev, bad = lease.ParseEventID(*m.Prev)
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[key]
	if s == nil {
		return
	}
	if bad != nil {
		// An event of the session that cannot be read: its watchers would miss it.
		for x := range s.watchers.all() {
			x.sender.End(lease.ErrResync)
			e.drop(key, s, x)
		}
		return
	}
	if m.Event != nil {
		missed := false
		for x := range s.watchers.all() {
			_, gap := e.send(key, s, x, h)
			missed = missed || gap
		}
		if missed {
			e.missed(key)
		}
		if e.sessions[key] != s {
			return // every watcher ended
		}
	}
	if m.Next > 0 {
		e.schedule(key, s, m.Now, m.Next)
	}
}

// watching reports whether the engine watches the session of a message, read from the start of the
// message as events.lua writes an event's, {"u":"<user>","s":"<session>",…} (identifiers hold no
// quote: lease.ValidateID), so that the messages of the sessions other instances watch are not
// decoded; it answers true when the message does not start so (a hint, which cjson writes in any
// order, or no message of the engine's), which deliver then decodes to tell.
func (e *Engine) watching(payload string) bool {
	rest, ok := strings.CutPrefix(payload, `{"u":"`)
	if !ok {
		return true
	}
	user, rest, ok := strings.Cut(rest, `"`)
	if !ok {
		return true
	}
	if rest, ok = strings.CutPrefix(rest, `,"s":"`); !ok {
		return true
	}
	session, _, ok := strings.Cut(rest, `"`)
	if !ok {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessions[lease.Key{User: user, Session: session}] != nil
}

// schedule sets the settle timer of s to fire at the store time next (µs), as seen from the store
// time nowUS, unless it is set to fire earlier already. A deadline is only ever moved earlier
// here: a later one comes from the settle script itself when the timer fires, so an answer that
// arrives late never delays an expiry. e.mu must be held.
func (e *Engine) schedule(key lease.Key, s *watched, nowUS, next int64) {
	if s.dueUS != 0 && next >= s.dueUS {
		return
	}
	s.dueUS = next
	// A millisecond more, so that the script finds the deadline passed on the store's clock.
	e.setTimer(key, s, time.Duration(max(next-nowUS, 0))*time.Microsecond+time.Millisecond)
}

// setTimer (re)sets the settle timer of s to fire after d. e.mu must be held.
func (e *Engine) setTimer(key lease.Key, s *watched, d time.Duration) {
	if s.timer == nil {
		s.timer = time.AfterFunc(d, func() { e.fire(key, s) })
		return
	}
	s.timer.Reset(d)
}

// fire runs the settle script of a watched session at its deadline (or to keep its log), and
// schedules the next one. A failed script is retried after settleRetry.
func (e *Engine) fire(key lease.Key, s *watched) {
	e.mu.Lock()
	if e.shut || e.sessions[key] != s {
		e.mu.Unlock()
		return
	}
	s.dueUS = 0
	// The newest event each watch had before the script: the log the script reads holds them all,
	// unless the store lost data (settle.lua).
	had := make(map[*watcher]lease.EventID, s.watchers.len())
	for x := range s.watchers.all() {
		if x.ready {
			had[x] = x.last
		}
	}
	e.timers.Add(1) // before Close's Wait: Close sets shut under e.mu first
	e.mu.Unlock()
	defer e.timers.Done()

	nowUS, next, newest, err := e.settle(key)

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shut || e.sessions[key] != s {
		return
	}
	waiting := false // a watch is behind the log (below)
	if err == nil {
		lost, missed := false, false
		now, limit := time.Now(), e.silenceLimit()
		for x := range s.watchers.all() {
			last, ok := had[x]
			if !ok {
				continue
			}
			if x.last.Compare(x.behind) >= 0 {
				x.behind = lease.EventID{} // it had what the last settle found
			}
			switch {
			case newest.Compare(last) < 0:
				// The store no longer has events this watch was sent, nor maybe the state they
				// told of: it starts over from what the store holds now.
				x.sender.End(lease.ErrResync)
				e.drop(key, s, x)
				lost = true
			case x.behind != (lease.EventID{}) && now.Sub(x.behindAt) >= limit:
				// An event of the log that the watch did not have when a settle read it, and does
				// not have a silence limit later, was not published to it: the session had no
				// log when it was appended (events.lua), and the watch missed it.
				x.sender.End(lease.ErrResync)
				e.drop(key, s, x)
				missed = true
			case newest.Compare(x.last) > 0:
				// In flight, or missed: the next settle, a silence limit later, tells.
				if x.behind == (lease.EventID{}) {
					x.behind, x.behindAt = newest, now
				}
				waiting = true
			}
		}
		if lost && e.onLostEvents != nil {
			e.onLostEvents(key)
		}
		if missed {
			e.missed(key)
		}
		if e.sessions[key] != s {
			return // every watcher ended
		}
	}
	switch {
	case err != nil:
		if s.dueUS == 0 {
			s.dueUS = math.MaxInt64
			e.setTimer(key, s, settleRetry)
		}
	default:
		at := e.nextSettle(nowUS, next)
		if waiting {
			at = min(at, nowUS+e.silenceLimit().Microseconds())
		}
		e.schedule(key, s, nowUS, at)
	}
}

// silenceLimit is how long the engine waits for what it should hear on its subscription (its
// heartbeat, an event a settle found in the log) before it judges it lost: twice OpTimeout, and at
// least three heartbeats.
func (e *Engine) silenceLimit() time.Duration {
	return max(3*heartbeatEvery, 2*e.opTimeout)
}

// settle runs settle.lua on key, and answers the store time, the session's next deadline, and
// the id of its log's newest event (zero when it has none).
func (e *Engine) settle(key lease.Key) (nowUS, next int64, newest lease.EventID, err error) {
	const op = "settle"
	v, err := e.eval(e.ctx, op, settleFn, key)
	if err != nil {
		return 0, 0, lease.EventID{}, err
	}
	a, ok := v.([]any)
	if ok && len(a) == 3 {
		nowUS, ok1 := a[0].(int64)
		next, ok2 := a[1].(int64)
		id, ok3 := a[2].(string)
		if ok1 && ok2 && ok3 && nowUS > 0 && next >= 0 {
			if id == "" {
				return nowUS, next, lease.EventID{}, nil
			}
			if newest, err := lease.ParseEventID(id); err == nil {
				return nowUS, next, newest, nil
			}
		}
	}
	return 0, 0, lease.EventID{}, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
}

// watchReply is watch.lua's answer.
type watchReply struct {
	full     bool // the user is at the limit of sessions: the watch was refused, nothing else is set
	lease    lease.Lease
	position string
	resumed  bool
	replay   []lease.Event
	tabs     []lease.Tab
	next     int64
}

func parseWatch(key lease.Key, v any) (watchReply, error) {
	bad := fmt.Errorf("leaseredis: malformed watch reply %v", v)
	a, ok := v.([]any)
	if !ok || (len(a) != 6 && len(a) != 1) {
		return watchReply{}, bad
	}
	if len(a) == 1 {
		if status, _, _, err := parseReply(key, a[0]); err != nil || status != statusFull {
			return watchReply{}, bad
		}
		return watchReply{full: true}, nil
	}
	status, l, _, err := parseReply(key, a[0])
	if err != nil {
		return watchReply{}, err
	}
	position, ok1 := a[1].(string)
	resumed, ok2 := a[2].(int64)
	replay, ok3 := a[3].([]any)
	next, ok4 := a[5].(int64)
	if status != statusOK || !ok1 || !ok2 || !ok3 || !ok4 || len(replay)%2 != 0 || next < 0 {
		return watchReply{}, bad
	}
	if position != "" {
		if _, err := lease.ParseEventID(position); err != nil {
			return watchReply{}, bad
		}
	}
	r := watchReply{lease: l, position: position, resumed: resumed == 1, next: next}
	for i := 0; i < len(replay); i += 2 {
		id, ok1 := replay[i].(string)
		data, ok2 := replay[i+1].(string)
		if !ok1 || !ok2 {
			return watchReply{}, bad
		}
		ev, err := parseEvent(key, id, data)
		if err != nil {
			return watchReply{}, err
		}
		r.replay = append(r.replay, ev)
	}
	if r.tabs, err = parseTabs(a[4]); err != nil {
		return watchReply{}, err
	}
	return r, nil
}

// parseTabs reads the tabs as presence.lua's tabs_reply answers them; nil for none.
func parseTabs(v any) ([]lease.Tab, error) {
	a, ok := v.([]any)
	if !ok || len(a)%4 != 0 {
		return nil, fmt.Errorf("leaseredis: malformed tabs %v", v)
	}
	var tabs []lease.Tab
	for i := 0; i < len(a); i += 4 {
		id, ok1 := a[i].(string)
		label, ok2 := a[i+1].(string)
		hidden, ok3 := a[i+2].(int64)
		connected, ok4 := a[i+3].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || connected <= 0 {
			return nil, fmt.Errorf("leaseredis: malformed tabs %v", v)
		}
		tabs = append(tabs, lease.Tab{TabID: id, Label: label, Hidden: hidden == 1, ConnectedAt: micros(connected)})
	}
	return tabs, nil
}

// wireMessage is a message of the subscription (see events.lua): an event and the session's next
// deadline, or the deadline alone.
type wireMessage struct {
	User    string     `json:"u"`
	Session string     `json:"s"`
	ID      string     `json:"id"`
	Prev    *string    `json:"p"` // the id of the session's event before this one; nil from libraries before it
	Event   *wireEvent `json:"ev"`
	Now     int64      `json:"now,string"`
	Next    int64      `json:"next,string"`
}

// wireEvent is an event as the scripts write it in the log and publish it (see events.lua).
type wireEvent struct {
	Type   lease.EventType `json:"type"`
	Epoch  int64           `json:"epoch,string"`
	Holder *struct {
		Tab    string `json:"tab"`
		Label  string `json:"label"`
		Hidden bool   `json:"hidden"`
	} `json:"holder"`
	Prev *struct {
		Tab   string `json:"tab"`
		Epoch int64  `json:"epoch,string"`
	} `json:"prev"`
	Requester *struct {
		Tab    string `json:"tab"`
		Label  string `json:"label"`
		Hidden bool   `json:"hidden"`
	} `json:"requester"`
	Reason string `json:"reason"`
	At     int64  `json:"at,string"`
	Tab    *struct {
		ID        string `json:"id"`
		Label     string `json:"label"`
		Hidden    bool   `json:"hidden"`
		Connected int64  `json:"connected,string"`
	} `json:"tab"`
}

func parseEvent(key lease.Key, id, data string) (lease.Event, error) {
	if _, err := lease.ParseEventID(id); err != nil {
		return lease.Event{}, fmt.Errorf("leaseredis: malformed event id %q", id)
	}
	var w wireEvent
	if err := json.Unmarshal([]byte(data), &w); err != nil || w.Type == "" || w.At <= 0 {
		return lease.Event{}, fmt.Errorf("leaseredis: malformed event %q", data)
	}
	return w.event(key, id), nil
}

// event is w as a lease.Event of key with the id id.
func (w *wireEvent) event(key lease.Key, id string) lease.Event {
	ev := lease.Event{ID: id, Key: key, Type: w.Type, Epoch: w.Epoch, Reason: w.Reason, At: micros(w.At)}
	if h := w.Holder; h != nil {
		ev.Holder = &lease.Holder{TabID: h.Tab, Label: h.Label, Hidden: h.Hidden}
	}
	if p := w.Prev; p != nil {
		ev.Previous = &lease.Previous{TabID: p.Tab, Epoch: p.Epoch}
	}
	if r := w.Requester; r != nil {
		ev.Requester = &lease.Holder{TabID: r.Tab, Label: r.Label, Hidden: r.Hidden}
	}
	if t := w.Tab; t != nil {
		ev.Tab = &lease.Tab{TabID: t.ID, Label: t.Label, Hidden: t.Hidden, ConnectedAt: micros(t.Connected)}
	}
	return ev
}

// Sharded Pub/Sub, on a Redis Cluster. A PUBLISH there is broadcast to every node of the Cluster,
// so each event would cost every node; the scripts SPUBLISH instead, on the channel of the user's
// hash tag (userChannel), which only the user's shard carries. An instance keeps one connection
// per shard it needs (a shardSub, by the address of the shard's primary) and SSUBSCRIBEs on it the
// channel of each user it has watchers for, while it has them and shardLinger longer.
//
// go-redis would resubscribe a connection it reconnects with one SSUBSCRIBE of every channel,
// which Redis refuses when they hash to different slots; and the messages sent meanwhile are lost
// anyway. So a shardSub never reconnects: any error on it (its node died, a ping unanswered, a
// MOVED answer) ends it and every watch of its users with lease.ErrResync; their next Watch
// subscribes again, on the shard's primary of the moment. A slot that leaves the node (Redis
// ends its channels' subscriptions with a SUNSUBSCRIBE) ends the subscriptions of those channels'
// users alone.
//
// A subscription must be on a primary, and a Watch registers only while the subscription it
// waited for stands; why, and how: docs/engines.md, "Events". readShard asks the node's role
// (onPrimary) after each confirmed SSUBSCRIBE, every one and not only a shard's first (a shardSub
// outlives its users' channels, and a demotion with none ends nothing); register refuses a watch
// whose subscription ended meanwhile (subscribe's live).

// shardHealth is how long a shard's connection may stay silent before it is pinged; a ping
// unanswered as long again ends it.
const shardHealth = 5 * time.Second

// shardLinger is how long the subscription of a user outlives the last watch of the user: a
// stream that reconnects, or a tab that opens the next page, finds it confirmed already.
const shardLinger = 10 * time.Second

// userChannel is the sharded Pub/Sub channel of the events of user's sessions (see events.lua).
func (e *Engine) userChannel(user string) string { return e.prefix + ":{" + user + "}:events" }

// channelUser is the user whose channel is channel (userChannel); ok is false for another channel.
func (e *Engine) channelUser(channel string) (user string, ok bool) {
	rest, ok := strings.CutPrefix(channel, e.prefix+":{")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "}:events")
}

// shardSub is the sharded subscription of one shard. Its fields but ps and stop are protected by
// Engine.mu; its writer closes ps when it ends.
type shardSub struct {
	addr  string        // the shard's primary when it was made
	node  *redis.Client // the client of that node, which asks its role
	ps    *redis.PubSub // never reconnected: see above
	stop  chan struct{} // closed when it ends
	ended bool
	// queue holds the SSUBSCRIBE and SUNSUBSCRIBE to send, in order; wake tells its writer.
	queue []shardOp
	wake  chan struct{}
	// confirming holds, per channel, the subscriptions sent and not confirmed yet, in order;
	// unsubscribing counts the SUNSUBSCRIBEs sent and not confirmed yet.
	confirming    map[string][]*userSub
	unsubscribing map[string]int
}

type shardOp struct {
	channel   string
	u         *userSub // the subscription to confirm; nil for a SUNSUBSCRIBE
	subscribe bool
}

// userSub is the subscription to one user's channel. Its fields are protected by Engine.mu, but
// ready, which is closed once Redis confirmed it or its shardSub ended (err then says why).
type userSub struct {
	shard *shardSub
	refs  int // the watches holding it
	ready chan struct{}
	err   error
}

// subscribeShard subscribes to user's channel on the connection of its shard, or joins the
// subscription there is, and waits at most OpTimeout until Redis confirmed it. release lets go of
// it: the last watch to let go unsubscribes. shard is the subscription, which stands while it is
// e.users[user].
func (e *Engine) subscribeShard(ctx context.Context, cluster *redis.ClusterClient, user string) (release func(), shard *userSub, err error) {
	const op = "watch"
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	channel := e.userChannel(user)
	e.mu.Lock()
	u := e.users[user]
	e.mu.Unlock()
	if u == nil {
		// Where the channel's slot is served: read from the slot map, outside e.mu.
		node, err := cluster.MasterForKey(ctx, channel)
		if err != nil {
			return nil, nil, &lease.UnavailableError{Op: op, Err: err}
		}
		addr := node.Options().Addr
		e.mu.Lock()
		if u = e.users[user]; u == nil {
			if e.shut {
				e.mu.Unlock()
				return nil, nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
			}
			sub := e.shards[addr]
			if sub == nil {
				sub = e.startShard(node, addr)
			}
			u = &userSub{shard: sub, ready: make(chan struct{})}
			e.users[user] = u
			sub.send(shardOp{channel: channel, u: u, subscribe: true})
		}
	} else {
		e.mu.Lock()
		if e.users[user] != u { // ended meanwhile: try again
			e.mu.Unlock()
			return e.subscribeShard(ctx, cluster, user)
		}
	}
	u.refs++
	e.mu.Unlock()
	release = func() { e.releaseShard(user, u) }

	select {
	case <-u.ready:
		if u.err != nil {
			e.locked(release)
			return nil, nil, &lease.UnavailableError{Op: op, Err: u.err}
		}
		return release, u, nil
	case <-ctx.Done():
		e.locked(release)
		if e.ctx.Err() != nil {
			return nil, nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
		}
		return nil, nil, &lease.UnavailableError{Op: op, Err: errNotSubscribed}
	}
}

// locked runs f under e.mu.
func (e *Engine) locked(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}

// releaseShard lets go of one hold of u, the subscription of user. The last one unsubscribes
// after shardLinger, unless a watch of the user took it again meanwhile. e.mu must be held.
func (e *Engine) releaseShard(user string, u *userSub) {
	if e.users[user] != u {
		return // its shard ended: nothing to let go of
	}
	if u.refs--; u.refs > 0 {
		return
	}
	time.AfterFunc(shardLinger, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.shut || e.users[user] != u || u.refs > 0 {
			return
		}
		delete(e.users, user)
		u.shard.send(shardOp{channel: e.userChannel(user)})
	})
}

// startShard makes the subscription of the shard whose primary is addr, on node, the client of
// that node, and starts its writer, whose first SSUBSCRIBE makes go-redis open the connection.
// Close waits for the writer and the reader it starts. e.mu must be held, and Close not begun
// (e.shut false).
func (e *Engine) startShard(node *redis.Client, addr string) *shardSub {
	sub := &shardSub{
		addr:          addr,
		node:          node,
		ps:            node.SSubscribe(e.ctx), // no I/O until the first SSUBSCRIBE
		stop:          make(chan struct{}),
		wake:          make(chan struct{}, 1),
		confirming:    make(map[string][]*userSub),
		unsubscribing: make(map[string]int),
	}
	if e.shards == nil {
		e.shards, e.users = make(map[string]*shardSub), make(map[string]*userSub)
	}
	e.shards[addr] = sub
	e.timers.Add(1)
	go e.writeShard(sub)
	return sub
}

// send queues op for the writer of sub. e.mu must be held.
func (sub *shardSub) send(op shardOp) {
	if sub.ended {
		return
	}
	sub.queue = append(sub.queue, op)
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// writeShard sends the queued SSUBSCRIBEs and SUNSUBSCRIBEs of sub, one at a time and in order,
// each noted first as awaiting its confirmation, and starts the reader once the first is sent
// (a read before it would open the connection to any node). It returns when sub ends or the
// engine closes, and closes the connection, which ends the reader.
func (e *Engine) writeShard(sub *shardSub) {
	defer e.timers.Done()
	defer sub.ps.Close()
	reading := false
	for {
		select {
		case <-sub.wake:
		case <-sub.stop:
			return
		case <-e.ctx.Done():
			return
		}
		for {
			e.mu.Lock()
			if sub.ended || len(sub.queue) == 0 {
				e.mu.Unlock()
				break
			}
			op := sub.queue[0]
			sub.queue = sub.queue[1:]
			if op.subscribe {
				sub.confirming[op.channel] = append(sub.confirming[op.channel], op.u)
			} else {
				sub.unsubscribing[op.channel]++
			}
			e.mu.Unlock()

			ctx, cancel := context.WithTimeout(e.ctx, e.opTimeout)
			var err error
			if op.subscribe {
				err = sub.ps.SSubscribe(ctx, op.channel)
			} else {
				err = sub.ps.SUnsubscribe(ctx, op.channel)
			}
			cancel()
			if err != nil {
				e.endShard(sub, err)
				return
			}
			if !reading {
				reading = true
				e.timers.Add(1) // the writer is counted: Close's Wait has not returned
				go e.readShard(sub)
			}
		}
	}
}

// readShard receives the messages of sub: it confirms subscriptions, hands events to deliver and
// pings a silent connection. Anything else ends sub. It returns when sub ends or the engine
// closes.
func (e *Engine) readShard(sub *shardSub) {
	defer e.timers.Done()
	pinged := false
	for {
		m, err := sub.ps.ReceiveTimeout(e.ctx, shardHealth)
		if e.ctx.Err() != nil {
			return
		}
		select {
		case <-sub.stop:
			return
		default:
		}
		var netErr net.Error
		switch {
		case err != nil && errors.As(err, &netErr) && netErr.Timeout() && !pinged:
			pinged = true
			if err := sub.ps.Ping(e.ctx); err != nil {
				e.endShard(sub, err)
				return
			}
			continue
		case err != nil:
			e.endShard(sub, err)
			return
		}
		pinged = false
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "ssubscribe" {
				if err := e.onPrimary(sub); err != nil {
					e.endShard(sub, err)
					return
				}
			}
			if err := e.confirmShard(sub, m); err != nil {
				e.endShard(sub, err)
				return
			}
		case *redis.Message:
			e.deliver(m.Payload)
		}
	}
}

// errNotPrimary is why a sharded subscription ended on a node that is no primary (see above).
var errNotPrimary = errors.New("leaseredis: the node of a sharded subscription is not a primary (a failover made it a replica)")

// onPrimary asks the node of sub, which has just confirmed a subscription, whether it is a
// primary (its INFO's role), and answers errNotPrimary if not.
func (e *Engine) onPrimary(sub *shardSub) error {
	ctx, cancel := context.WithTimeout(e.ctx, e.opTimeout)
	defer cancel()
	// INFO, which the README's ACL rules allow, where ROLE is @dangerous.
	info, err := sub.node.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if strings.Contains(info, "\nrole:master") || strings.HasPrefix(info, "role:master") {
		return nil
	}
	return errNotPrimary
}

// confirmShard handles a confirmation of sub: a SSUBSCRIBE makes the oldest subscription awaiting
// it ready, a SUNSUBSCRIBE ends the oldest awaiting one. A SUNSUBSCRIBE nobody sent is Redis
// ending a subscription because its slot left the node (a reshard, a failover): that user's
// subscription ends, and its watches start over; the connection and the other users' channels
// on it stand (a reshard moves a slot at a time, and each would otherwise start over every watch
// of the shard). The slot map is reloaded, for the next Watch to subscribe where the slot is now.
func (e *Engine) confirmShard(sub *shardSub, m *redis.Subscription) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch m.Kind {
	case "ssubscribe":
		if q := sub.confirming[m.Channel]; len(q) > 0 {
			close(q[0].ready)
			if len(q) == 1 {
				delete(sub.confirming, m.Channel)
			} else {
				sub.confirming[m.Channel] = q[1:]
			}
		}
	case "sunsubscribe":
		if sub.unsubscribing[m.Channel] == 0 {
			user, ok := e.channelUser(m.Channel)
			u := e.users[user]
			if !ok || u == nil || u.shard != sub {
				return fmt.Errorf("leaseredis: Redis ended the subscription of %s, which this connection does not hold", m.Channel)
			}
			e.reloadSlots()
			e.endUser(user, u, fmt.Errorf("leaseredis: Redis ended the subscription of %s (its slot moved)", m.Channel))
			return nil
		}
		if sub.unsubscribing[m.Channel]--; sub.unsubscribing[m.Channel] == 0 {
			delete(sub.unsubscribing, m.Channel)
		}
	}
	return nil
}

// endShard ends sub after err: its users' subscriptions fail (with err for those not confirmed
// yet), and every watch of those users ends with lease.ErrResync, since events may have been
// lost. Their next Watch subscribes again. Whatever err is (a node gone, a node that is no
// primary, a MOVED answer to a SSUBSCRIBE), the Cluster may have changed, so the slot map is
// reloaded (reloadSlots): the next Watch would subscribe where a stale one says.
func (e *Engine) endShard(sub *shardSub, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sub.ended {
		return
	}
	e.reloadSlots()
	sub.ended = true
	close(sub.stop)
	if e.shards[sub.addr] == sub {
		delete(e.shards, sub.addr)
	}
	for user, u := range e.users {
		if u.shard == sub {
			e.endUser(user, u, err)
		}
	}
}

// reloadSlots has the Cluster client reload its slot map, in the background: go-redis does so on
// a command's MOVED, not on a subscription's.
func (e *Engine) reloadSlots() {
	if cluster, ok := e.client.(*redis.ClusterClient); ok {
		cluster.ReloadState(e.ctx)
	}
}

// endUser ends u, the subscription of user, after err: it fails if Redis had not confirmed it
// yet, and every watch of user ends with lease.ErrResync. e.mu must be held.
func (e *Engine) endUser(user string, u *userSub, err error) {
	delete(e.users, user)
	select {
	case <-u.ready:
	default:
		u.err = err
		close(u.ready)
	}
	for key, s := range e.sessions {
		if key.User != user {
			continue
		}
		for x := range s.watchers.all() {
			x.release = nil // the subscription is gone already
			x.sender.End(lease.ErrResync)
			e.drop(key, s, x)
		}
	}
}
