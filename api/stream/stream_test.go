package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// plainViews renders snapshots and events as their ids; package api has the real views.
type plainViews struct{}

func (plainViews) Snapshot(w *lease.Watch, _ string) ([]byte, error) {
	return []byte(`"` + w.Position + `"`), nil
}
func (plainViews) Event(ev lease.Event) ([]byte, error) { return []byte(`"` + ev.ID + `"`), nil }

// clock is a settable clock for tickets.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func testConfig(t *testing.T) Config {
	t.Helper()
	eng, err := leasemem.New(leasemem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return Config{
		Feed:       eng,
		Presence:   eng,
		Nonces:     leasemem.NewNonceStore(nil),
		Views:      plainViews{},
		Catalog:    func(func(string)) func() { return func() {} },
		Registerer: prometheus.NewRegistry(),
	}
}

func TestNewRefusesMissingDependenciesAndBadOptions(t *testing.T) {
	for name, edit := range map[string]func(*Config){
		"Feed":                 func(c *Config) { c.Feed = nil },
		"Presence":             func(c *Config) { c.Presence = nil },
		"Nonces":               func(c *Config) { c.Nonces = nil },
		"Views":                func(c *Config) { c.Views = nil },
		"Catalog":              func(c *Config) { c.Catalog = nil },
		"Registerer":           func(c *Config) { c.Registerer = nil },
		"Options.PerUser":      func(c *Config) { c.Options.PerUser = -1 },
		"Options.PerInstance":  func(c *Config) { c.Options.PerInstance = -1 },
		"Options.Keepalive":    func(c *Config) { c.Options.Keepalive = -time.Second },
		"Options.WriteTimeout": func(c *Config) { c.Options.WriteTimeout = -time.Second },
		"Options.TicketSecret": func(c *Config) { c.Options.TicketSecret = []byte("short") },
	} {
		t.Run("a config without a valid "+name+" is refused", func(t *testing.T) {
			cfg := testConfig(t)
			edit(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("New = %v, want an error naming %s", err, name)
			}
		})
	}
}

func TestStreamsBeyondALimitOrAfterCloseAreRefusedWithTheirReason(t *testing.T) {
	cfg := testConfig(t)
	cfg.Options = Options{PerUser: 1, PerInstance: 2}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &stream{user: "alice", wake: func() {}}, &stream{user: "bob", wake: func() {}}
	if err := h.admit(a); err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if err := h.admit(&stream{user: "alice", wake: func() {}}); !errors.As(err, &le) || le.Limit != "user" || le.Max != 1 {
		t.Fatalf("a second stream of alice: %v, want the user limit", err)
	}
	if err := h.admit(b); err != nil {
		t.Fatal(err)
	}
	if err := h.admit(&stream{user: "carol", wake: func() {}}); !errors.As(err, &le) || le.Limit != "instance" || le.Max != 2 {
		t.Fatalf("a third stream: %v, want the instance limit", err)
	}
	h.leave(a)
	h.leave(b)
	if n := h.Open(); n != 0 {
		t.Fatalf("%d streams open after both left", n)
	}
	h.Close(context.Background())
	if err := h.admit(&stream{user: "alice", wake: func() {}}); !errors.Is(err, ErrClosing) {
		t.Fatalf("a stream after Close: %v, want ErrClosing", err)
	}
}

func TestATicketIsRedeemedOnceForItsSessionAndTabUntilItExpires(t *testing.T) {
	clk := &clock{t: time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)}
	cfg := testConfig(t)
	cfg.Now, cfg.HS256Secret = clk.Now, []byte(strings.Repeat("s", 32))
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := lease.Key{User: "alice", Session: "doc-1"}
	issue := func() string {
		tk, _, err := h.IssueTicket(ctx, key, "tab-a", clk.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	refused := func(what string, err, want error) {
		t.Helper()
		var te *TicketError
		if !errors.As(err, &te) || (want != nil && err != want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
	}

	tk := issue()
	got, err := h.RedeemTicket(ctx, tk, "doc-1", "")
	if err != nil || got.Sub != "alice" || got.Sid != "doc-1" || got.Tab != "tab-a" || got.Until != clk.Now().Add(time.Hour).UnixMilli() {
		t.Fatalf("RedeemTicket = %+v, %v", got, err)
	}
	_, err = h.RedeemTicket(ctx, tk, "doc-1", "")
	refused("a second redeem", err, errTicketUsed)

	tk = issue()
	_, err = h.RedeemTicket(ctx, tk, "doc-2", "")
	refused("another session", err, errTicketSession)
	_, err = h.RedeemTicket(ctx, tk, "doc-1", "tab-b")
	refused("another tab", err, ErrTicketTab)
	forged := []byte(tk)
	if i := len(forged) - 10; forged[i] == 'A' { // a character of the MAC
		forged[i] = 'B'
	} else {
		forged[i] = 'A'
	}
	_, err = h.RedeemTicket(ctx, string(forged), "doc-1", "")
	refused("a forged ticket", err, ErrTicketInvalid)
	if _, err := h.RedeemTicket(ctx, tk, "doc-1", "tab-a"); err != nil {
		t.Fatalf("a ticket refused for another session or tab is not used up: %v", err)
	}

	tk = issue()
	clk.Advance(TicketTTL)
	_, err = h.RedeemTicket(ctx, tk, "doc-1", "")
	refused("an expired ticket", err, errTicketExpired)

	// A ticket lives no longer than the credential it was issued to.
	tk, _, err = h.IssueTicket(ctx, key, "tab-a", clk.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	_, err = h.RedeemTicket(ctx, tk, "doc-1", "")
	refused("a ticket past its credential's end", err, errTicketExpired)

	cfg.Registerer, cfg.Options.TicketSecret = prometheus.NewRegistry(), []byte(strings.Repeat("o", 32))
	other, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.RedeemTicket(ctx, issue(), "doc-1", "")
	refused("a ticket of another key", err, ErrTicketInvalid)
}

func TestRefreshAfterIsAThirdOfTheTTL(t *testing.T) {
	if got := RefreshAfter(45 * time.Second); got != 15*time.Second {
		t.Fatalf("RefreshAfter(45s) = %v", got)
	}
	if got := RefreshAfter(0); got <= 0 {
		t.Fatalf("RefreshAfter(0) = %v, want a positive floor", got)
	}
}

// TestStoreCallsAreToldWhenTheyAreServedToo: Config.StoreCall hears of the calls the store
// served, not only of those it failed, so that an outage they opened is closed by them too.
func TestStoreCallsAreToldWhenTheyAreServedToo(t *testing.T) {
	cfg := testConfig(t)
	cfg.HS256Secret = []byte(strings.Repeat("s", 32))
	var mu sync.Mutex
	var calls []string
	cfg.StoreCall = func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("%s %v", op, err))
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tk, _, err := h.IssueTicket(ctx, lease.Key{User: "alice", Session: "doc-1"}, "tab-a", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.RedeemTicket(ctx, tk, "doc-1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.RedeemTicket(ctx, tk, "doc-1", ""); err == nil {
		t.Fatal("a ticket was redeemed twice")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"new_nonce <nil>", "use_nonce <nil>"}; !slices.Equal(calls, want) {
		t.Fatalf("StoreCall heard %q, want %q (a ticket refused as used is no call of the store's to tell)", calls, want)
	}
}
