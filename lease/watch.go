package lease

import (
	"context"
	"errors"
	"math"
	"sync"
)

// ErrResync ends a watch that lost events: its reader fell behind by more than the watch's buffer,
// or the engine lost its link to the store's notifications (a Redis Pub/Sub reconnect). The events
// received before it are valid and in order; some after them are missing. The caller watches again
// with the id of the last event it handled, which replays what the log still has or starts from a
// fresh snapshot.
var ErrResync = errors.New("lease: watch fell behind; watch again")

// Watch is one watch of a session, as Feed.Watch answers it. The fields are set by the engine
// before Watch returns and never change afterwards, but that the caller may drop the start
// (DropStart).
//
// # Delivery
//
// Events delivers the session's events that follow Position, in the order of their ids, each at
// most once, without gaps: a watch that would have to skip an event ends with ErrResync instead.
// The engine hands the watch events without ever blocking; the watch holds up to Buffer of them
// for a reader that is behind, and one more ends it (memory per watch is bounded by the buffer,
// whatever the reader does; the event a reader has just taken may count for a moment, so a reader
// exactly Buffer behind may be ended too). The buffer costs nothing while it is empty: the channel
// holds one event, the others wait in a queue that a goroutine of the watch feeds into it only
// while the reader is behind.
//
// # Ending
//
// A watch ends when the caller calls Close, when the ctx given to Watch is done, when the engine
// is closed, or with ErrResync. The engine then closes Events after the events still buffered,
// and Err says why. Close is the caller's to call once it is done, whatever ended the watch; it is
// safe to call more than once and from any goroutine, and drops what is still buffered.
type Watch struct {
	// Key is the session watched.
	Key Key
	// WatchStart is where the watch starts (its fields read as the watch's: w.Snapshot…), until
	// the caller drops it (DropStart).
	*WatchStart

	// An idle watch is small: streams hold one each, by the ten thousand.
	events chan *Event // capacity 1: a pointer, so that the channel's buffer is a word
	// afterStop cancels the context.AfterFunc that ends the watch with ctx.
	afterStop func() bool

	// mu protects the fields below, and serialises the sends on events with its close.
	mu sync.Mutex
	// stop is the engine's, called once by Close or when ctx is done; nil once called.
	stop func()
	// behind is made when the reader first falls behind (see backlog).
	behind *backlog
	err    error
	ready  func() // see OnReady
	buffer int32
	// forwarding reports that forward runs.
	forwarding bool
	closed     bool // Close was called
	ended      bool
	eventsShut bool // events is closed
}

// backlog is what a watch whose reader fell behind holds: queue has the events that follow the
// one in events, oldest first; forward sends queue[0] on events and then removes it. The events
// delivered are those of events, then queue: at most Watch.buffer. quit is closed by Close:
// forward stops sending.
type backlog struct {
	queue []Event
	quit  chan struct{}
}

// Events is the channel of the events after Position. It is closed when the watch ends, after
// the events still buffered.
func (w *Watch) Events() <-chan *Event { return w.events }

// OnReady has ready called after each event put on Events and when Events is closed, so that a
// reader may wait for something to do without a goroutine blocked on Events: after ready, it reads
// Events without blocking until it finds nothing. ready must not block: it may be called with the
// engine's locks held.
func (w *Watch) OnReady(ready func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready = ready
}

// notify calls the ready of OnReady. The caller holds mu.
func (w *Watch) notify() {
	if w.ready != nil {
		w.ready()
	}
}

// Buffer is the number of events the watch holds for a reader that is behind; one more ends it
// with ErrResync.
func (w *Watch) Buffer() int { return int(w.buffer) }

// Err says why the watch ended: nil while it runs and after Close; ErrResync; the ctx's error; an
// *UnavailableError when the engine was closed or lost its store.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch, drops the events it still holds, and releases what the engine holds for
// it.
func (w *Watch) Close() {
	w.mu.Lock()
	if !w.ended {
		w.ended, w.err = true, nil
	}
	if !w.closed {
		w.closed = true
		if w.behind != nil {
			w.behind.queue = nil
			close(w.behind.quit)
		}
		w.shutIfDrained()
	}
	w.mu.Unlock()
	w.afterStop()
	w.stopOnce()
}

// stopOnce calls the engine's stop, once. No lock of the watch is held while it runs.
func (w *Watch) stopOnce() {
	w.mu.Lock()
	stop := w.stop
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (w *Watch) end(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	w.ended, w.err = true, err
	w.shutIfDrained()
	return true
}

// shutIfDrained closes events once the watch has ended and forward has nothing more to send. The
// caller holds mu.
func (w *Watch) shutIfDrained() {
	if w.ended && !w.forwarding && !w.eventsShut && (w.behind == nil || len(w.behind.queue) == 0 || w.closed) {
		w.eventsShut = true
		close(w.events)
		w.notify()
	}
}

// forward sends the queued events on events, in order, until the queue is empty or Close is
// called. It runs only while the reader is behind.
func (w *Watch) forward() {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.behind
	for !w.closed && len(b.queue) > 0 {
		ev := b.queue[0]
		w.mu.Unlock()
		select {
		case w.events <- &ev:
		case <-b.quit:
		}
		w.mu.Lock()
		if !w.closed {
			b.queue[0] = Event{}
			b.queue = b.queue[1:]
			w.notify()
		}
	}
	b.queue, w.forwarding = nil, false
	w.shutIfDrained()
}

// WatchStart is where a watch starts, read in the step that started it. The caller reads it to
// begin (a stream writes its snapshot and replay) and then drops it (DropStart): an idle watch
// keeps only what it needs for the events to come.
type WatchStart struct {
	// Snapshot is the lease at Position. It is always set; a caller that is not Resumed must start
	// from it.
	Snapshot Lease
	// Tabs are the tabs present at Position (see Presence.Tabs); nil when there are none.
	Tabs []Tab
	// Position is the id of the session's last event when the watch started, or empty when the
	// session had none (or the store forgot it). Snapshot and Tabs include every event up to it;
	// Events delivers the events after it. It is the SSE id of a snapshot.
	Position string
	// Resumed reports that the log still held every event after the caller's after: Replay holds
	// them (possibly none), and the caller need not start from Snapshot.
	Resumed bool
	// Replay is the events after the caller's after up to Position, in order, when Resumed.
	Replay []Event
}

// DropStart lets the watch forget where it started (WatchStart), once the caller has read it:
// Snapshot, Tabs, Position, Resumed and Replay must not be read after. The engine never reads
// them once it has handed the watch out.
func (w *Watch) DropStart() { w.WatchStart = nil }

// WatchSender is the engine's side of a Watch: what the engine keeps among the session's watchers.
// Its methods never block, and may be called with the engine's locks held.
type WatchSender struct{ w *Watch }

// NewWatch is for engines: it returns a Watch of key that buffers up to buffer events
// (DefaultWatchBuffer when buffer is not positive), and the sender that feeds it. The engine fills
// the Watch's exported fields before handing it out. stop is called once, without any lock of the
// Watch held, when the caller closes the watch or ctx is done: the engine then forgets the sender.
// stop is not called when the engine itself ends the watch (Send answering false, or End); the
// engine forgets the sender then.
func NewWatch(ctx context.Context, key Key, buffer int, stop func()) (*Watch, *WatchSender) {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	buffer = min(buffer, math.MaxInt32)
	w := &Watch{Key: key, WatchStart: &WatchStart{}, events: make(chan *Event, 1), buffer: int32(buffer),
		stop: stop, afterStop: neverDone}
	if ctx.Done() != nil { // a ctx that is never done costs the watch nothing
		w.afterStop = context.AfterFunc(ctx, func() {
			w.end(ctx.Err())
			w.stopOnce()
		})
	}
	return w, &WatchSender{w}
}

// neverDone is the afterStop of a watch whose ctx is never done.
func neverDone() bool { return false }

// Send hands ev to the watch without blocking. When the buffer is full, it ends the watch with
// ErrResync. It answers false when the watch has ended (now or before): the engine forgets the
// sender.
func (s *WatchSender) Send(ev Event) bool {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	if !w.forwarding {
		sent := new(Event) // a copy made here: a watch that ended or queues ev makes none
		*sent = ev
		select {
		case w.events <- sent: // the reader keeps up: no queue, no goroutine
			w.notify()
			return true
		default:
		}
	}
	if w.behind == nil {
		w.behind = &backlog{quit: make(chan struct{})}
	}
	if len(w.events)+len(w.behind.queue) >= int(w.buffer) {
		w.ended, w.err = true, ErrResync
		w.shutIfDrained()
		w.afterStop()
		return false
	}
	w.behind.queue = append(w.behind.queue, ev)
	if !w.forwarding {
		w.forwarding = true
		go w.forward()
	}
	return true
}

// End ends the watch with err (ErrResync, or an *UnavailableError when the engine closes). It does
// nothing to a watch that has ended.
func (s *WatchSender) End(err error) {
	if s.w.end(err) {
		s.w.afterStop()
	}
}

// Done reports whether the watch has ended.
func (s *WatchSender) Done() bool {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.ended
}
