package stream

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// Every stream's end is a log line and a count, with why it ended: the client went away, its
// access token expired, the instance shuts down.
func TestAStreamsEndIsLoggedAndCountedWithItsReason(t *testing.T) {
	cfg := testConfig(t)
	var logs syncbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		req := Request{Key: lease.Key{User: q.Get("user"), Session: "doc-1"}, Tab: lease.Tab{TabID: "tab-a"}, RequestID: "req-" + q.Get("user")}
		if q.Has("for") {
			d, _ := time.ParseDuration(q.Get("for"))
			req.Until = time.Now().Add(d)
		}
		if err := h.Serve(w, r, req); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	open := func(query string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		fmt.Fprintf(c, "GET /?%s HTTP/1.1\r\nHost: x\r\n\r\n", query)
		r := bufio.NewReader(c)
		readUntil(t, r, "event: snapshot")
		return c, r
	}
	ended := func(reason string, n float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got float64
			for j, r := range endReasons {
				if r == reason {
					got = counterValue(h.ended[j])
				}
			}
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("tablease_event_streams_ended_total{reason=%q} = %v, want %v; log:\n%s", reason, got, n, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	gone, _ := open("user=gone")
	_ = gone.Close()
	ended("client_gone", 1)
	if log := logs.String(); !strings.Contains(log, `msg="event stream ended" request_id=req-gone sub=gone session=doc-1 reason=client_gone duration_s=`) {
		t.Errorf("no log line of the stream whose client went away:\n%s", log)
	}

	_, expiring := open("user=short&for=300ms")
	readUntil(t, expiring, "event: shutdown")
	ended("token_expired", 1)

	_, last := open("user=last")
	h.Close(context.Background())
	readUntil(t, last, "event: shutdown")
	ended("shutdown", 1)
	ended("client_gone", 1)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// paddedViews renders every event with a payload of 4 KiB, so that a few events fill buffers.
type paddedViews struct{ plainViews }

func (paddedViews) Event(ev lease.Event) ([]byte, error) {
	return []byte(`"` + ev.ID + strings.Repeat("x", 4<<10) + `"`), nil
}

// A client that stops reading loses its stream: the send buffer of a stream taken over is capped,
// so a write soon waits out its deadline (write_failed), rather than the kernel taking megabytes
// of events for a reader that never comes back.
func TestAReaderThatStopsReadingLosesItsStream(t *testing.T) {
	cfg := testConfig(t)
	eng := cfg.Feed.(*leasemem.Engine)
	cfg.Views = paddedViews{}
	cfg.Options.WriteTimeout = 300 * time.Millisecond
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := lease.Key{User: "slow", Session: "doc-1"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.Serve(w, r, Request{Key: key, Tab: lease.Tab{TabID: "tab-a"}}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	defer h.Close(context.Background())
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	readUntil(t, bufio.NewReader(c), "event: snapshot") // and then never read again

	// Events of 4 KiB each, one a millisecond, until the stream ends: with the buffer capped, some
	// 128 KiB of them fill it and the next write waits out the 300 ms deadline (about 300 events in
	// all); an uncapped buffer grows toward Linux's 4 MiB maximum and takes more than 512.
	tabs := []string{"tab-a", "tab-b"}
	i := 0
	for ; counterValue(h.ended[endWriteFailed]) == 0; i++ {
		if i == 512 {
			t.Fatalf("the stream of a client that reads nothing took %d events of 4 KiB and still runs", i)
		}
		if _, err := eng.Acquire(context.Background(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: tabs[i%2]}, TTL: time.Minute, Mode: lease.ModeTakeover}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // a pace at which the stream writes each event as it comes
	}
	t.Logf("the stream ended after %d events of 4 KiB", i)
}

func TestAWriteThatMissesItsDeadlineIsWriteFailedAndAnyOtherFailureClientGone(t *testing.T) {
	for err, want := range map[error]endReason{
		fmt.Errorf("write tcp: %w", os.ErrDeadlineExceeded): endWriteFailed,
		fmt.Errorf("write tcp: %w", syscall.ECONNRESET):     endClientGone,
		fmt.Errorf("write tcp: %w", syscall.EPIPE):          endClientGone,
	} {
		if got := writeEnd(err); got != want {
			t.Errorf("writeEnd(%v) = %s, want %s", err, endReasons[got], endReasons[want])
		}
	}
}
