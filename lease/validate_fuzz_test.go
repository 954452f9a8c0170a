package lease_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tablease/tablease/lease"
)

// idPattern is the identifier rule of the README, written as a regular expression independently of
// ValidateID's byte loop.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9._:@|-]{1,128}$`)

// FuzzValidateID compares ValidateID with the rule as a regular expression, and checks what the
// engines rely on: a valid identifier is safe as part of a store key (no brace, which would change
// a Redis Cluster hash tag; no slash, which separates the parts of a lease cursor; no space or
// control byte), two valid identifiers make a key that passes Validate, and the lease cursor of
// that key reads back as the same key. A refusal is an *InvalidError naming the field.
func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"tab-1", "alice@example.com", "u|1:doc.2_x", ".", "..", "...", "", "a/b", "{tag}",
		"a b", "é", strings.Repeat("a", 128), strings.Repeat("a", 129), "tab\x00", "-", "|"} {
		f.Add(s, "doc-1")
	}
	f.Fuzz(func(t *testing.T, s, other string) {
		err := lease.ValidateID("tabId", s)
		want := idPattern.MatchString(s) && s != "." && s != ".."
		if (err == nil) != want {
			t.Fatalf("ValidateID(%q) = %v, the rule says valid=%v", s, err, want)
		}
		if err != nil {
			var inv *lease.InvalidError
			if !errors.As(err, &inv) || inv.Field != "tabId" || !errors.Is(err, lease.ErrInvalid) {
				t.Fatalf("ValidateID(%q) refused with %#v, not an *InvalidError for tabId", s, err)
			}
			return
		}
		if strings.ContainsAny(s, "{}/ \t\r\n\x00") || !utf8.ValidString(s) {
			t.Fatalf("valid identifier %q holds a byte that store keys or cursors cannot take", s)
		}
		for _, k := range []lease.Key{{User: s, Session: s}, {User: s, Session: other}, {User: other, Session: s}} {
			if lease.ValidateID("x", k.User) != nil || lease.ValidateID("x", k.Session) != nil {
				continue
			}
			if err := k.Validate(); err != nil {
				t.Fatalf("key %+v of valid identifiers: %v", k, err)
			}
			cursor := lease.LeaseCursor(k)
			back, err := lease.ParseLeaseCursor(cursor)
			if err != nil || back != k {
				t.Fatalf("cursor %q of %+v reads back as %+v, %v", cursor, k, back, err)
			}
		}
	})
}

// FuzzParseLeaseCursor checks that every cursor ParseLeaseCursor reads names a valid key (nothing
// else may reach an engine), and that the cursor LeaseCursor writes for that key reads back as it.
// (Base64 lets a few spellings decode to the same bytes; a cursor is opaque, so that is harmless.)
func FuzzParseLeaseCursor(f *testing.F) {
	for _, s := range []string{lease.LeaseCursor(lease.Key{User: "alice", Session: "doc-1"}), "", "YWxpY2U", "YWxpY2UvZG9jLTE=",
		"YWxpY2UvZG9jLTF", "Ly8", "YS9iL2M", "YS8u"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cursor string) {
		k, err := lease.ParseLeaseCursor(cursor)
		if err != nil {
			if !errors.Is(err, lease.ErrInvalid) {
				t.Fatalf("ParseLeaseCursor(%q) = %v, not ErrInvalid", cursor, err)
			}
			return
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("ParseLeaseCursor(%q) = %+v, whose key is not valid: %v", cursor, k, err)
		}
		if back, err := lease.ParseLeaseCursor(lease.LeaseCursor(k)); err != nil || back != k {
			t.Fatalf("the cursor of %+v reads back as %+v, %v", k, back, err)
		}
	})
}

// FuzzValidateLabel checks that an accepted label is valid UTF-8 of at most MaxLabelLen
// characters, none of them a control or format character, that it survives a JSON round trip
// unchanged (labels travel in bodies and events), and that a reason is valid exactly when it is a
// valid label that is not blank.
func FuzzValidateLabel(f *testing.F) {
	for _, s := range []string{"", "Events — /events/evt-1", "tab\x00", "\u200b", "\u2028", "a\tb", "\xff",
		strings.Repeat("é", 200), strings.Repeat("é", 201), " ", "\u00a0", "🙂", "\ufffd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := lease.ValidateLabel(s)
		reasonErr := lease.ValidateReason(s)
		if (reasonErr == nil) != (err == nil && strings.TrimSpace(s) != "") {
			t.Fatalf("ValidateReason(%q) = %v while ValidateLabel = %v", s, reasonErr, err)
		}
		if err != nil {
			if !errors.Is(err, lease.ErrInvalid) {
				t.Fatalf("ValidateLabel(%q) = %v, not ErrInvalid", s, err)
			}
			return
		}
		if !utf8.ValidString(s) || utf8.RuneCountInString(s) > lease.MaxLabelLen {
			t.Fatalf("ValidateLabel accepted %q", s)
		}
		// s is valid UTF-8 here, so a U+FFFD in it is the replacement character itself (a
		// printable symbol), not a decoding error.
		for _, r := range s {
			if r < 0x20 || (r >= 0x7f && r < 0xa0) || r == '\u2028' || r == '\u2029' {
				t.Fatalf("ValidateLabel accepted %q, which holds %U", s, r)
			}
		}
		b, _ := json.Marshal(s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Fatalf("label %q does not survive JSON: %q, %v", s, back, err)
		}
	})
}
