package lease_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tablease/tablease/lease"
)

func TestParseEventIDReadsOnlyWhatStringWrites(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want lease.EventID
		ok   bool
	}{
		{"0-0", lease.EventID{}, true},
		{"1764680400123-0", lease.EventID{Millis: 1764680400123}, true},
		{"1764680400123-17", lease.EventID{Millis: 1764680400123, Seq: 17}, true},
		{"18446744073709551615-18446744073709551615", lease.EventID{Millis: 1<<64 - 1, Seq: 1<<64 - 1}, true},
		{"", lease.EventID{}, false},
		{"-", lease.EventID{}, false},
		{"12", lease.EventID{}, false},
		{"12-", lease.EventID{}, false},
		{"-3", lease.EventID{}, false},
		{"12-3-4", lease.EventID{}, false},
		{"+12-3", lease.EventID{}, false},
		{"012-3", lease.EventID{}, false},
		{"12-03", lease.EventID{}, false},
		{"12 -3", lease.EventID{}, false},
		{"1a-3", lease.EventID{}, false},
		{"18446744073709551616-0", lease.EventID{}, false},
		{"123456789012345678901-0", lease.EventID{}, false},
	} {
		got, err := lease.ParseEventID(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseEventID(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("ParseEventID(%q) = %v, want lease.ErrInvalid", tc.in, err)
		}
		if err == nil && got.String() != tc.in {
			t.Errorf("ParseEventID(%q).String() = %q", tc.in, got.String())
		}
	}
}

func TestEventIDsCompareByMillisecondThenSequence(t *testing.T) {
	ordered := []string{"0-0", "0-1", "1-0", "9-5", "10-0", "10-1", "10-10", "100-2"}
	for i, a := range ordered {
		for j, b := range ordered {
			got, err := lease.CompareEventIDs(a, b)
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if err != nil || got != want {
				t.Errorf("CompareEventIDs(%q, %q) = %d, %v; want %d", a, b, got, err, want)
			}
		}
	}
	if _, err := lease.CompareEventIDs("1-0", "x"); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("CompareEventIDs with a bad id = %v, want lease.ErrInvalid", err)
	}
}

func TestNextEventIDStrictlyIncreasesWhateverTheClock(t *testing.T) {
	t0 := time.UnixMilli(1764680400123).Add(456 * time.Microsecond)
	steps := []struct {
		name string
		at   time.Time
		want lease.EventID
	}{
		{"the first event takes the clock", t0, lease.EventID{Millis: 1764680400123}},
		{"the same millisecond counts on", t0.Add(300 * time.Microsecond), lease.EventID{Millis: 1764680400123, Seq: 1}},
		{"a later millisecond starts again at 0", t0.Add(2 * time.Millisecond), lease.EventID{Millis: 1764680400125}},
		{"a clock that stepped back counts on", t0.Add(-time.Hour), lease.EventID{Millis: 1764680400125, Seq: 1}},
		{"a clock before 1970 counts on", time.UnixMilli(-5), lease.EventID{Millis: 1764680400125, Seq: 2}},
	}
	var last lease.EventID
	for _, s := range steps {
		got := lease.NextEventID(last, s.at)
		if got != s.want || got.Compare(last) <= 0 {
			t.Errorf("%s: NextEventID(%v, %v) = %v, want %v", s.name, last, s.at, got, s.want)
		}
		last = got
	}
}

func TestEventTypesNameTheirStream(t *testing.T) {
	for _, typ := range []lease.EventType{lease.EventGranted, lease.EventReleased, lease.EventExpired, lease.EventTakenOver,
		lease.EventRevoked, lease.EventHandoffRequested, lease.EventUpdated} {
		if typ.Stream() != "lease" {
			t.Errorf("%s.Stream() = %q, want lease", typ, typ.Stream())
		}
	}
	for _, typ := range []lease.EventType{lease.EventTabJoined, lease.EventTabLeft} {
		if typ.Stream() != "tabs" {
			t.Errorf("%s.Stream() = %q, want tabs", typ, typ.Stream())
		}
	}
}

var key = lease.Key{User: "alice", Session: "doc-1"}

func TestAWatchDeliversInOrderUntilItsBufferOverflows(t *testing.T) {
	var stops atomic.Int32
	w, s := lease.NewWatch(t.Context(), key, 2, func() { stops.Add(1) })
	if w.Buffer() != 2 || w.Key != key {
		t.Fatalf("NewWatch: buffer %d, key %+v; want 2, %+v", w.Buffer(), w.Key, key)
	}
	for i, id := range []string{"1-0", "1-1"} {
		if !s.Send(lease.Event{ID: id}) {
			t.Fatalf("Send %d into a buffer with room answered false", i)
		}
	}
	if s.Send(lease.Event{ID: "1-2"}) || !s.Done() {
		t.Fatal("Send into a full buffer answered true, or did not end the watch")
	}
	if s.Send(lease.Event{ID: "1-3"}) {
		t.Error("Send after the end answered true")
	}
	var got []string
	for ev := range w.Events() {
		got = append(got, ev.ID)
	}
	if len(got) != 2 || got[0] != "1-0" || got[1] != "1-1" {
		t.Errorf("events delivered = %v, want 1-0 and 1-1", got)
	}
	if !errors.Is(w.Err(), lease.ErrResync) {
		t.Errorf("Err = %v, want lease.ErrResync", w.Err())
	}
	if stops.Load() != 0 {
		t.Error("the engine's stop was called for a watch the engine ended")
	}
	w.Close()
	w.Close()
	if stops.Load() != 1 || !errors.Is(w.Err(), lease.ErrResync) {
		t.Errorf("after Close: %d stops, Err %v; want 1 and ErrResync kept", stops.Load(), w.Err())
	}
}

func TestAWatchBehindGetsEveryEventInOrder(t *testing.T) {
	const buffer = 50
	w, s := lease.NewWatch(t.Context(), key, buffer, func() {})
	defer w.Close()
	sent, got := 0, 0
	send := func(n int) {
		for range n {
			if !s.Send(lease.Event{ID: "1-" + strconv.Itoa(sent)}) {
				t.Fatalf("Send %d with %d events read, buffer %d: answered false", sent, got, buffer)
			}
			sent++
		}
	}
	read := func(n int) {
		for range n {
			if ev := <-w.Events(); ev.ID != "1-"+strconv.Itoa(got) {
				t.Fatalf("event %d = %s, want 1-%d", got, ev.ID, got)
			}
			got++
		}
	}
	send(buffer) // the reader is a whole buffer behind
	read(buffer / 2)
	// One fewer than it read: the event last read may still count until the watch sees it taken.
	send(buffer/2 - 1)
	read(buffer - 1)
	send(1)
	read(1)
	if s.Done() || w.Err() != nil {
		t.Errorf("a watch whose reader caught up ended: %v", w.Err())
	}
}

func TestClosingAWatchWhoseReaderIsBehindDropsItsEvents(t *testing.T) {
	before := runtime.NumGoroutine()
	w, s := lease.NewWatch(t.Context(), key, 8, func() {})
	for i := range 5 {
		s.Send(lease.Event{ID: "1-" + strconv.Itoa(i)})
	}
	w.Close()
	n := 0
	for range w.Events() {
		n++
	}
	if n > 1 || w.Err() != nil {
		t.Errorf("after Close: %d events delivered, Err %v; want at most the one in the channel, nil", n, w.Err())
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before the watch", runtime.NumGoroutine(), before)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOnReadyTellsOfEveryEventAndOfTheEnd(t *testing.T) {
	w, s := lease.NewWatch(t.Context(), key, 4, func() {})
	defer w.Close()
	ready := make(chan struct{}, 1)
	w.OnReady(func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	})
	// wait reads Events without blocking, after each ready, until it has want events or it is
	// closed; it answers whether it is open.
	got := 0
	wait := func(want int) bool {
		deadline := time.After(10 * time.Second)
		for {
			for {
				select {
				case ev, open := <-w.Events():
					if !open {
						return false
					}
					if ev.ID != "1-"+strconv.Itoa(got) {
						t.Fatalf("event %d = %s", got, ev.ID)
					}
					got++
					continue
				default:
				}
				break
			}
			if got == want {
				return true
			}
			select {
			case <-ready:
			case <-deadline:
				t.Fatalf("no ready after %d events of %d", got, want)
			}
		}
	}
	sent := 0
	for round := range 40 {
		for range round%3 + 1 { // up to 3 at once: the reader is behind and the queue is fed
			if !s.Send(lease.Event{ID: "1-" + strconv.Itoa(sent)}) {
				t.Fatalf("Send %d answered false", sent)
			}
			sent++
		}
		if !wait(sent) {
			t.Fatal("Events closed while the watch runs")
		}
	}
	s.End(&lease.UnavailableError{Op: "watch", Err: errors.New("closed")})
	if wait(-1) {
		t.Fatal("unreachable")
	}
	if got != sent || !errors.Is(w.Err(), lease.ErrUnavailable) {
		t.Errorf("%d events of %d, Err %v", got, sent, w.Err())
	}
}

// An idle watch must not cost its buffer: streams hold one each, by the ten thousand.
func TestAnIdleWatchDoesNotHoldItsBuffer(t *testing.T) {
	const n = 1000
	ws := make([]*lease.Watch, n)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range ws {
		ws[i], _ = lease.NewWatch(t.Context(), key, lease.DefaultWatchBuffer, func() {})
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 1024 {
		t.Errorf("an idle watch of buffer %d allocates %d bytes, want at most 1 KiB", lease.DefaultWatchBuffer, per)
	}
	for _, w := range ws {
		w.Close()
	}
}

func TestAWatchEndsOnceWhicheverEndsItFirst(t *testing.T) {
	t.Run("Close ends it with no error and stops it once", func(t *testing.T) {
		var stops atomic.Int32
		w, s := lease.NewWatch(t.Context(), key, 0, func() { stops.Add(1) })
		if w.Buffer() != lease.DefaultWatchBuffer {
			t.Errorf("buffer = %d, want the default %d", w.Buffer(), lease.DefaultWatchBuffer)
		}
		w.Close()
		w.Close()
		if _, open := <-w.Events(); open || w.Err() != nil || stops.Load() != 1 || !s.Done() || s.Send(lease.Event{}) {
			t.Errorf("after Close: open %v, Err %v, %d stops; want closed, nil, 1", open, w.Err(), stops.Load())
		}
	})
	t.Run("the context ends it with its error and stops it once", func(t *testing.T) {
		stopped := make(chan struct{}, 2)
		ctx, cancel := context.WithCancel(t.Context())
		w, _ := lease.NewWatch(ctx, key, 1, func() { stopped <- struct{}{} })
		cancel()
		if _, open := <-w.Events(); open {
			t.Fatal("the watch delivered an event")
		}
		<-stopped
		w.Close()
		if !errors.Is(w.Err(), context.Canceled) || len(stopped) != 0 {
			t.Errorf("Err = %v, %d more stops; want context.Canceled and none", w.Err(), len(stopped))
		}
	})
	t.Run("the engine ends it with its error and is not called back", func(t *testing.T) {
		var stops atomic.Int32
		ctx, cancel := context.WithCancel(t.Context())
		w, s := lease.NewWatch(ctx, key, 1, func() { stops.Add(1) })
		closed := &lease.UnavailableError{Op: "watch", Err: errors.New("closed")}
		s.End(closed)
		s.End(lease.ErrResync)
		cancel() // after the end: changes nothing
		if _, open := <-w.Events(); open || !errors.Is(w.Err(), lease.ErrUnavailable) || stops.Load() != 0 {
			t.Errorf("after End: open %v, Err %v, %d stops; want closed, the engine's error, 0", open, w.Err(), stops.Load())
		}
	})
}

// A watch without its start (lease.Watch.DropStart) is what an idle stream keeps of it, by the ten
// thousand: it stays within the 128-byte size class.
func TestAWatchWithoutItsStartIsSmall(t *testing.T) {
	if size := unsafe.Sizeof(lease.Watch{}); size > 128 {
		t.Fatalf("a watch takes %d bytes without its start, want at most 128 (the size class idle streams pay)", size)
	}
}
