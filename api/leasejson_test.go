package api

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// checkJSON is the answer of POST …/lease/check as its view: what writeLeaseAnswer must write.
type checkJSON struct {
	Valid bool       `json:"valid"`
	Lease *leaseJSON `json:"lease"`
}

// TestLeaseAnswersAreTheirViewsEncoded: the lease answers written by appendLease are, byte for
// byte and with the same headers, what Echo's encoding/json makes of leaseView's struct, for
// leases of every shape and strings that need escaping.
func TestLeaseAnswersAreTheirViewsEncoded(t *testing.T) {
	e := echo.New()
	answer := func(write func(echo.Context) error) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		if err := write(e.NewContext(httptest.NewRequest(http.MethodGet, "/", nil), rec)); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	strs := []string{"", "t", "tab-1", "Ev ü", `a"b\c`, "<script>&", "a<b", "x>y", "a&b", "tab\x00\x1f", "\x01", "del\x7f", `q"q`, `b\\s`, "\u2028\u2029", "bad \xff utf-8", "日本語"}
	r := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return strs[r.IntN(len(strs))] }
	now := time.Date(2026, 12, 6, 12, 0, 0, 123456789, time.FixedZone("X", 3600))
	at := func() time.Time {
		if r.IntN(5) == 0 {
			return time.Time{}
		}
		return now.Add(time.Duration(r.Int64N(int64(4*time.Minute))) - 2*time.Minute)
	}
	for i := range 3000 {
		l := lease.Lease{
			Key:          lease.Key{User: pick(), Session: pick()},
			Held:         r.IntN(2) == 0,
			Holder:       lease.Holder{TabID: pick(), Label: pick(), Hidden: r.IntN(2) == 0},
			Epoch:        r.Int64N(1 << 53),
			GrantedAt:    at(),
			ExpiresAt:    at(),
			TTL:          time.Duration(r.Int64N(int64(2*time.Minute))) + time.Millisecond,
			Transitions:  r.Int64N(1 << 40),
			BlockedUntil: at(),
			Now:          now,
		}
		if r.IntN(3) == 0 {
			l.Handoff = &lease.HandoffState{Requester: lease.Holder{TabID: pick(), Label: pick(), Hidden: r.IntN(2) == 0}, Until: at(), Reserved: r.IntN(2) == 0}
		}
		tabID := pick()
		if r.IntN(3) == 0 {
			tabID = l.Holder.TabID
		}
		token := ""
		if r.IntN(2) == 0 {
			token = pick() + "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ1In0.c2ln"
		}
		check := r.IntN(3) == 0
		got := answer(func(c echo.Context) error { return writeLeaseAnswer(c, l, tabID, token, check) })
		want := answer(func(c echo.Context) error {
			v := leaseView(l, tabID)
			v.Token = token
			if check {
				return c.JSON(http.StatusOK, checkJSON{Valid: true, Lease: v})
			}
			return c.JSON(http.StatusOK, v)
		})
		if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) || got.Code != want.Code ||
			fmt.Sprint(got.Header()) != fmt.Sprint(want.Header()) {
			t.Fatalf("case %d (%+v, tab %q, token %q, check %v):\n got %d %v %s\nwant %d %v %s", i, l, tabID, token, check,
				got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
		}
	}
}
