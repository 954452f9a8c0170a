package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
)

// TestAUsedTicketIsRefusedAfterRedisLosesItsData redeems an event ticket, empties Redis (as a
// restart without persistence would) and redeems it again: the store no longer remembers the use,
// but the ticket is of the generation before the loss, and is refused all the same.
func TestAUsedTicketIsRefusedAfterRedisLosesItsData(t *testing.T) {
	rds := redistest.Start(t)
	base, _ := startServer(t, e2eRedisEnv(t, rds))
	tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"},
		api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := client{t: t, base: base, token: tok}
	ticket := func() string {
		t.Helper()
		code, body := c.do("POST", "/v1/sessions/doc-1/events/ticket", map[string]any{"tabId": "tab-a"})
		tk, _ := body["ticket"].(string)
		if code != 200 || tk == "" {
			t.Fatalf("ticket: %d %v", code, body)
		}
		return tk
	}
	// redeem opens the stream with the ticket, and answers its status.
	redeem := func(tk string) int {
		t.Helper()
		resp, err := http.Get(base + "/v1/sessions/doc-1/events?tabId=tab-a&ticket=" + tk)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	used, unused := ticket(), ticket()
	if code := redeem(used); code != 200 {
		t.Fatalf("the first use of a ticket: %d, want 200", code)
	}
	if code := redeem(used); code != 401 {
		t.Fatalf("the second use of a ticket: %d, want 401", code)
	}
	rds.Flush(t)
	if code := redeem(used); code != 401 {
		t.Fatalf("a used ticket after Redis lost its data: %d, want 401", code)
	}
	if code := redeem(unused); code != 401 {
		t.Fatalf("a ticket issued before Redis lost its data: %d, want 401", code)
	}
	if code := redeem(ticket()); code != 200 {
		t.Fatalf("a ticket issued after the loss: %d, want 200", code)
	}
}
