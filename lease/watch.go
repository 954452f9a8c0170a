package lease

import (
	"context"
	"errors"
	"sync"
)

// ErrResync ends a watch that lost events: its reader fell behind by more than the watch's buffer,
// or the engine lost its link to the store's notifications (a Redis Pub/Sub reconnect). The events
// received before it are valid and in order; some after them are missing. The caller watches again
// with the id of the last event it handled, which replays what the log still has or starts from a
// fresh snapshot.
var ErrResync = errors.New("lease: watch fell behind; watch again")

// Watch is one watch of a session, as Feed.Watch answers it. The fields are set by the engine
// before Watch returns and never change afterwards.
//
// # Delivery
//
// Events delivers the session's events that follow Position, in the order of their ids, each at
// most once, without gaps: a watch that would have to skip an event ends with ErrResync instead.
// The channel is the watch's buffer: the engine hands it events without ever blocking, and a full
// buffer ends the watch (memory per watch is bounded by the buffer, whatever the reader does).
//
// # Ending
//
// A watch ends when the caller calls Close, when the ctx given to Watch is done, when the engine
// is closed, or with ErrResync. The engine then closes Events after the events still buffered,
// and Err says why. Close is the caller's to call once it is done, whatever ended the watch; it is
// safe to call more than once and from any goroutine.
type Watch struct {
	// Key is the session watched.
	Key Key
	// Snapshot is the lease at Position, read in the step that started the watch. It is always
	// set; a caller that is not Resumed must start from it.
	Snapshot Lease
	// Tabs are the tabs present at Position (see Presence.Tabs); nil when there are none.
	Tabs []Tab
	// Position is the id of the last event in the session's log when the watch started, or empty
	// when the log was empty. Snapshot and Tabs include every event up to it; Events delivers the
	// events after it. It is the SSE id of a snapshot.
	Position string
	// Resumed reports that the log still held every event after the caller's after: Replay holds
	// them (possibly none), and the caller need not start from Snapshot.
	Resumed bool
	// Replay is the events after the caller's after up to Position, in order, when Resumed.
	Replay []Event

	events chan Event
	stop   func() // the engine's, called once by Close or when ctx is done
	once   sync.Once
	// afterStop cancels the context.AfterFunc that ends the watch with ctx.
	afterStop func() bool

	// mu protects ended and err, and serialises the sends on events with its close.
	mu    sync.Mutex
	ended bool
	err   error
}

// Events is the channel of the events after Position. It is closed when the watch ends.
func (w *Watch) Events() <-chan Event { return w.events }

// Err says why the watch ended: nil while it runs and after Close; ErrResync; the ctx's error; an
// *UnavailableError when the engine was closed or lost its store.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch and releases what the engine holds for it.
func (w *Watch) Close() {
	w.end(nil)
	w.afterStop()
	w.once.Do(w.stop)
}

func (w *Watch) end(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	w.ended, w.err = true, err
	close(w.events)
	return true
}

// WatchSender is the engine's side of a Watch: what the engine keeps among the session's watchers.
// Its methods never block, and may be called with the engine's locks held.
type WatchSender struct{ w *Watch }

// NewWatch is for engines: it returns a Watch of key whose Events buffer holds buffer events
// (DefaultWatchBuffer when buffer is not positive), and the sender that feeds it. The engine fills
// the Watch's exported fields before handing it out. stop is called once, without any lock of the
// Watch held, when the caller closes the watch or ctx is done: the engine then forgets the sender.
// stop is not called when the engine itself ends the watch (Send answering false, or End); the
// engine forgets the sender then.
func NewWatch(ctx context.Context, key Key, buffer int, stop func()) (*Watch, *WatchSender) {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	w := &Watch{Key: key, events: make(chan Event, buffer), stop: stop}
	w.afterStop = context.AfterFunc(ctx, func() {
		w.end(ctx.Err())
		w.once.Do(w.stop)
	})
	return w, &WatchSender{w}
}

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
	select {
	case w.events <- ev:
		return true
	default:
		w.ended, w.err = true, ErrResync
		close(w.events)
		w.afterStop()
		return false
	}
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
