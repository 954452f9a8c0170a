package stream

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
)

// TestAStreamRefusedDuringARedisPauseIsNotListedAfterwards: a Join that times out while Redis is
// paused is run by Redis when it resumes, after the stream was refused; the tab must not stay
// listed until its entry expires.
func TestAStreamRefusedDuringARedisPauseIsNotListedAfterwards(t *testing.T) {
	rds := redistest.Start(t)
	client, err := leaseredis.NewClient(rds.URL(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng, err := leaseredis.New(client, leaseredis.Options{OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	cfg := testConfig(t)
	cfg.Feed, cfg.Presence = eng, eng
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })

	key := lease.Key{User: "alice", Session: "doc-1"}
	ctx := context.Background()
	// Warm up: the scripts are loaded and a connection is open, so that the Join below reaches
	// Redis's socket while it is paused.
	if _, err := eng.Join(ctx, key, "WARMUP", lease.Tab{TabID: "warm"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := eng.Leave(ctx, key, "WARMUP", "warm", 0); err != nil {
		t.Fatal(err)
	}

	rds.Pause(t)
	req := httptest.NewRequest(http.MethodGet, "/v1/sessions/doc-1/events", nil)
	err = h.Serve(httptest.NewRecorder(), req, Request{Key: key, Tab: lease.Tab{TabID: "refused"}, Listed: true})
	if !errors.Is(err, lease.ErrUnavailable) {
		rds.Resume(t)
		t.Fatalf("Serve during the pause = %v, want lease.ErrUnavailable", err)
	}
	rds.Resume(t)

	deadline := time.Now().Add(20 * time.Second) // well under the entry's time to live (45s)
	for {
		tabs, err := eng.Tabs(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(tabs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused stream's tab is still listed: %+v", tabs)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}
