package lease_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

func TestLeaseCursorsReadBackTheKeyTheyName(t *testing.T) {
	id128 := strings.Repeat("a|b:c@d._-", 13)[:lease.MaxIDLen]
	for _, key := range []lease.Key{
		{User: "alice", Session: "doc-1"},
		{User: "a", Session: "b"},
		{User: id128, Session: id128},
		{User: "...", Session: "a:b|c@d"},
	} {
		c := lease.LeaseCursor(key)
		if len(c) > 512 || strings.ContainsFunc(c, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Errorf("LeaseCursor(%+v) = %q, want at most 512 characters of printable ASCII without spaces", key, c)
		}
		if got, err := lease.ParseLeaseCursor(c); err != nil || got != key {
			t.Errorf("ParseLeaseCursor(LeaseCursor(%+v)) = %+v, %v", key, got, err)
		}
	}
	for _, bad := range []string{"", "not a cursor", "YWxpY2U", "Li4vLi4", "YS9i/w", lease.LeaseCursor(lease.Key{User: "a"})} {
		if _, err := lease.ParseLeaseCursor(bad); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("ParseLeaseCursor(%q) = %v, want lease.ErrInvalid", bad, err)
		}
	}
}

func TestKeysCompareByUserThenSession(t *testing.T) {
	keys := []lease.Key{
		{User: "a-b", Session: "c"},
		{User: "alice", Session: "doc-2"},
		{User: "a", Session: "z"},
		{User: "alice", Session: "doc-10"},
		{User: "B", Session: "x"},
	}
	slices.SortFunc(keys, lease.Key.Compare)
	want := []lease.Key{
		{User: "B", Session: "x"},
		{User: "a", Session: "z"},
		{User: "a-b", Session: "c"},
		{User: "alice", Session: "doc-10"},
		{User: "alice", Session: "doc-2"},
	}
	if !slices.Equal(keys, want) {
		t.Errorf("sorted keys = %+v, want %+v", keys, want)
	}
}

func TestAdminArgumentsAreValidated(t *testing.T) {
	good := lease.RevokeRequest{Key: lease.Key{User: "alice", Session: "doc-1"}, Admin: "root", Reason: "why"}
	for _, tc := range []struct {
		name string
		mod  func(r *lease.RevokeRequest)
		ok   bool
	}{
		{"a plain revoke", func(r *lease.RevokeRequest) {}, true},
		{"a block in whole milliseconds and a request id", func(r *lease.RevokeRequest) { r.Block, r.RequestID = 1500*time.Millisecond, "req-1" }, true},
		{"a reason of 200 characters", func(r *lease.RevokeRequest) { r.Reason = strings.Repeat("é", 200) }, true},
		{"a bad key", func(r *lease.RevokeRequest) { r.Key.Session = "a/b" }, false},
		{"no admin", func(r *lease.RevokeRequest) { r.Admin = "" }, false},
		{"a blank reason", func(r *lease.RevokeRequest) { r.Reason = " \u00a0 " }, false},
		{"a reason with a tab", func(r *lease.RevokeRequest) { r.Reason = "a\tb" }, false},
		{"a reason of 201 characters", func(r *lease.RevokeRequest) { r.Reason = strings.Repeat("a", 201) }, false},
		{"a negative block", func(r *lease.RevokeRequest) { r.Block = -time.Second }, false},
		{"a block of a fraction of a millisecond", func(r *lease.RevokeRequest) { r.Block = time.Millisecond + time.Microsecond }, false},
		{"a bad request id", func(r *lease.RevokeRequest) { r.RequestID = "a b" }, false},
	} {
		req := good
		tc.mod(&req)
		err := req.Validate()
		if tc.ok && err != nil {
			t.Errorf("Validate of %s: %v", tc.name, err)
		}
		var inv *lease.InvalidError
		if !tc.ok && !errors.As(err, &inv) {
			t.Errorf("Validate of %s = %v, want an *InvalidError", tc.name, err)
		}
	}
	var inv *lease.InvalidError
	if err := lease.ValidateReason("a\nb"); !errors.As(err, &inv) || inv.Field != "reason" {
		t.Errorf("ValidateReason of a newline = %v, want an *InvalidError naming the reason", err)
	}

	for _, tc := range []struct {
		limit, want int
	}{{0, lease.DefaultPageLimit}, {1, 1}, {lease.MaxPageLimit, lease.MaxPageLimit}, {-1, -1}, {lease.MaxPageLimit + 1, -1}} {
		got, err := lease.ListQuery{Limit: tc.limit}.Validate()
		got2, err2 := lease.AuditQuery{Limit: tc.limit}.Validate()
		if tc.want < 0 {
			if !errors.Is(err, lease.ErrInvalid) || !errors.Is(err2, lease.ErrInvalid) {
				t.Errorf("a limit of %d = %v, %v; want lease.ErrInvalid", tc.limit, err, err2)
			}
			continue
		}
		if err != nil || err2 != nil || got != tc.want || got2 != tc.want {
			t.Errorf("a limit of %d = %d, %v and %d, %v; want %d", tc.limit, got, err, got2, err2, tc.want)
		}
	}
	for _, q := range []lease.AuditQuery{{Session: "doc-1"}, {User: "a b"}, {User: "alice", Session: ".."}} {
		if _, err := q.Validate(); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("AuditQuery%+v.Validate() = %v, want lease.ErrInvalid", q, err)
		}
	}
	if _, err := (lease.ListQuery{User: "a/b"}).Validate(); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("a ListQuery of a bad user = %v, want lease.ErrInvalid", err)
	}
}
