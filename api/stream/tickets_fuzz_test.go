package stream

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// FuzzRedeemTicket edits a ticket just issued (cuts a range out of it and puts the fuzz input in
// its place) and redeems the result for a session and tab from the input. A ticket is redeemed
// only as it was issued, byte for byte, for its session and for its tab or any tab, and once; every
// refusal is a *TicketError and uses nothing up: the ticket as issued still redeems afterwards when
// the session and tab are its own.
func FuzzRedeemTicket(f *testing.F) {
	f.Add(uint16(0), uint16(0), "", "doc-1", "tab-1")
	f.Add(uint16(0), uint16(0), "", "doc-1", "")
	f.Add(uint16(0), uint16(0), "", "doc-2", "tab-1")
	f.Add(uint16(0), uint16(0), "", "doc-1", "tab-2")
	f.Add(uint16(1000), uint16(1000), "=", "doc-1", "tab-1")
	f.Add(uint16(1), uint16(2), "2", "doc-1", "tab-1")
	f.Add(uint16(3), uint16(4), "x", "doc-1", "tab-1")
	f.Add(uint16(0), uint16(1000), "t1.e30.", "doc-1", "tab-1")
	f.Fuzz(func(t *testing.T, from, to uint16, insert, sid, tab string) {
		now := time.UnixMilli(1764680400123)
		clock := func() time.Time { return now }
		nonces := leasemem.NewNonceStore(clock)
		h := &Handler{tickets: newTicketBook([]byte(strings.Repeat("s", MinTicketSecretLen)), nil, nonces, clock), storeCall: func(string, error) {}}
		key := lease.Key{User: "alice", Session: "doc-1"}
		issued, _, err := h.IssueTicket(t.Context(), key, "tab-1", time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		i, j := min(int(from), len(issued)), min(int(to), len(issued))
		if j < i {
			i, j = j, i
		}
		edited := issued[:i] + insert + issued[j:]
		ctx := context.Background()
		ownTarget := sid == "doc-1" && (tab == "" || tab == "tab-1")

		claims, err := h.tickets.redeem(ctx, edited, sid, tab)
		var te *TicketError
		switch {
		case err == nil && (edited != issued || !ownTarget):
			t.Fatalf("redeemed %q (issued %q) for session %q tab %q: %+v", edited, issued, sid, tab, claims)
		case err == nil:
			if claims.Sub != key.User || claims.Sid != key.Session || claims.Tab != "tab-1" || claims.Exp != now.Add(TicketTTL).UnixMilli() {
				t.Fatalf("redeemed claims %+v", claims)
			}
			if _, err := h.tickets.redeem(ctx, issued, sid, tab); err != errTicketUsed {
				t.Fatalf("a second redeem answered %v, want %v", err, errTicketUsed)
			}
			return
		case !errors.As(err, &te):
			t.Fatalf("redeem(%q) = %v, not a *TicketError", edited, err)
		case edited == issued && ownTarget:
			t.Fatalf("the ticket as issued was refused for its own session and tab: %v", err)
		}
		if _, err := h.tickets.redeem(ctx, issued, "doc-1", "tab-1"); err != nil {
			t.Fatalf("after a refusal (%v), the ticket as issued was refused: %v", te, err)
		}
	})
}
