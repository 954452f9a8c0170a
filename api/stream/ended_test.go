package stream

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease"
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
