package stream

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// A stream writes its snapshot and its replay from where its watch started, and then drops that
// start: an idle stream keeps no copy of the lease it began with (lease.Watch.DropStart), and its
// watch is the small part that waits for events.
func TestAStreamDropsItsWatchsStartOnceWritten(t *testing.T) {
	cfg := testConfig(t)
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := lease.Key{User: "alice", Session: "doc-1"}
	if _, err := cfg.Feed.(lease.Engine).Acquire(ctx, lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a"}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w, err := cfg.Feed.Watch(ctx, key, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	position := w.Position
	rec := httptest.NewRecorder()
	var sse sseWriter
	sse.init(rec, time.Second, h.sent)
	sse.begin()
	last, err := sse.start(h.views, w, "tab-a", true)
	if err != nil {
		t.Fatal(err)
	}
	if last != position || !strings.Contains(rec.Body.String(), "event: snapshot\ndata: \""+position+"\"") {
		t.Fatalf("start answered %q and wrote %q, want the snapshot at %q", last, rec.Body.String(), position)
	}
	if w.WatchStart != nil {
		t.Fatal("the watch still holds its start once the stream wrote it")
	}
}
