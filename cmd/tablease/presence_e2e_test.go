package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

func TestATabPutThroughOneInstanceIsListedAndAnnouncedThroughAnother(t *testing.T) {
	c1, c2, _ := redisPair(t)
	s := openEvents(t, c1.base, "/v1/sessions/doc-1/events?tabId=tab-a&presence=false", c1.token)
	if snap := s.must("snapshot", 5*time.Second); len(snap["tabs"].([]any)) != 0 {
		t.Fatalf("a stream with presence=false is listed: %v", snap["tabs"])
	}
	for _, tab := range []struct{ id, label string }{{"tab-a", "Events"}, {"tab-b", "Calendar"}} {
		code, body := c2.do(http.MethodPut, "/v1/sessions/doc-1/tabs/"+tab.id, map[string]any{"label": tab.label})
		if code != 200 || body["ttlMs"] != float64(45000) || body["refreshAfterMs"] != float64(15000) {
			t.Fatalf("PUT %s through instance 2: %d %v", tab.id, code, body)
		}
		ev := s.must("tabs", 5*time.Second)
		if tb, _ := ev["tab"].(map[string]any); ev["type"] != "joined" || tb["tabId"] != tab.id || tb["label"] != tab.label {
			t.Fatalf("tabs event through instance 1: %v", ev)
		}
	}
	code, tabs := c1.do(http.MethodGet, "/v1/sessions/doc-1/tabs", nil)
	if list, _ := tabs["tabs"].([]any); code != 200 || len(list) != 2 {
		t.Fatalf("tabs through instance 1: %d %v", code, tabs)
	}
	req, _ := http.NewRequest(http.MethodDelete, c2.base+"/v1/sessions/doc-1/tabs/tab-b", nil)
	req.Header.Set("Authorization", "Bearer "+c2.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE through instance 2: %d", resp.StatusCode)
	}
	if ev := s.must("tabs", 5*time.Second); ev["type"] != "left" || ev["tab"].(map[string]any)["tabId"] != "tab-b" {
		t.Fatalf("tabs event through instance 1: %v", ev)
	}
}

// A Redis that restarts empty loses every presence entry: a stream still open lists its tab again
// as soon as Redis answers, before the snapshot it then starts over with, which lists it; not at
// its next refresh, a third of the 45 s TTL later.
func TestAStreamListsItsTabAgainAtOnceAfterRedisRestartsEmpty(t *testing.T) {
	c1, _, rds := redisPair(t)
	s := openEvents(t, c1.base, "/v1/sessions/doc-1/events?tabId=tab-a&label=Events", c1.token)
	s.must("snapshot", 5*time.Second)
	// Redis down long enough for the stream to try again while nothing answers, then back empty.
	rds.Stop(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := c1.do(http.MethodGet, "/readyz", nil); code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("readyz still 200 5 s after Redis stopped")
		}
	}
	rds.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatal("no snapshot within 10 s of Redis restarting empty")
		}
		if ev.name != "snapshot" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
			t.Fatalf("event data %q: %v", ev.data, err)
		}
		if tabs, _ := m["tabs"].([]any); len(tabs) != 1 || tabs[0].(map[string]any)["tabId"] != "tab-a" {
			t.Fatalf("the snapshot after Redis restarted empty lists %v, want tab-a", m["tabs"])
		}
		break
	}
	code, tabs := c1.do(http.MethodGet, "/v1/sessions/doc-1/tabs", nil)
	if list, _ := tabs["tabs"].([]any); code != 200 || len(list) != 1 {
		t.Fatalf("GET …/tabs after Redis restarted empty: %d %v", code, tabs)
	}
}
