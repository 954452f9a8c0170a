package leaseredis

import (
	"context"
	"fmt"
	"time"

	"github.com/tablease/tablease/lease"
)

// Join implements lease.Presence with join.lua: the entry of conn lives for Options.PresenceTTL,
// which Join answers. The instance that holds the connection refreshes it by calling Join again,
// every third of the TTL while the connection lives (the SSE layer does); an instance that dies
// leaves its entries to expire, and whoever settles the session first (a settle timer of an
// instance watching it, or any call on it) announces their tabs as left with lease.ReasonTimeout.
func (e *Engine) Join(ctx context.Context, key lease.Key, conn string, tab lease.Tab, seq int64) (time.Duration, error) {
	const op = "join"
	if err := lease.ValidateJoin(key, conn, tab, seq); err != nil {
		return 0, err
	}
	v, err := e.change(ctx, op, joinFn, key, conn, tab.TabID, tab.Label, flag(tab.Hidden), e.presenceTTL.Milliseconds(),
		lease.MaxPresence, seq)
	if err != nil {
		return 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
	}
	switch a[0] {
	case statusOK:
		return e.presenceTTL, nil
	case statusFull:
		return 0, &lease.SessionLimitError{Limit: e.perUser}
	case statusTabsFull:
		return 0, &lease.TabLimitError{Limit: lease.MaxPresence}
	}
	return 0, unexpected(op, fmt.Sprint(a[0]))
}

// Leave implements lease.Presence with leave.lua.
func (e *Engine) Leave(ctx context.Context, key lease.Key, conn, tabID string, seq int64) error {
	const op = "leave"
	if err := lease.ValidateLeave(key, conn, tabID, seq); err != nil {
		return err
	}
	v, err := e.change(ctx, op, leaveFn, key, conn, tabID, seq, e.presenceTTL.Milliseconds(), lease.MaxPresence)
	if err != nil {
		return err
	}
	if a, ok := v.([]any); !ok || len(a) != 1 {
		return &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
	}
	return nil
}

// Tabs implements lease.Presence with tabs.lua.
func (e *Engine) Tabs(ctx context.Context, key lease.Key) ([]lease.Tab, error) {
	const op = "tabs"
	if err := key.Validate(); err != nil {
		return nil, err
	}
	v, err := e.eval(ctx, op, tabsFn, key)
	if err != nil {
		return nil, err
	}
	tabs, err := parseTabs(v)
	if err != nil {
		return nil, &lease.UnavailableError{Op: op, Err: err}
	}
	return tabs, nil
}
