package lease_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// FuzzParseEventID checks the reading of Last-Event-ID: an id is accepted only in the one
// spelling String writes (so a client cannot name one event two ways), every id String writes is
// read back, the order of ids is the order of their (ms, seq) pairs, and the id NextEventID gives
// an event appended after last is after it, whatever the clock says. A refusal is an
// *InvalidError.
func FuzzParseEventID(f *testing.F) {
	for _, s := range []string{"1764680400123-0", "0-0", "1-2", "01-2", "1-02", "-1-2", "+1-2", "1-", "-", "",
		"18446744073709551615-18446744073709551615", "18446744073709551616-0", "1 -2", "1-2-3", "١-٢"} {
		f.Add(s, uint64(1764680400123), uint64(0), int64(1764680400123))
	}
	f.Add("5-5", uint64(1<<63), uint64(1<<64-1), int64(-1))
	f.Fuzz(func(t *testing.T, s string, ms, seq uint64, nowMs int64) {
		id, err := lease.ParseEventID(s)
		if err != nil {
			var inv *lease.InvalidError
			if !errors.As(err, &inv) || inv.Field != "lastEventId" {
				t.Fatalf("ParseEventID(%q) = %v, not an *InvalidError for lastEventId", s, err)
			}
		} else if id.String() != s {
			t.Fatalf("ParseEventID(%q) = %+v, which is written %q: two spellings of one id", s, id, id.String())
		}

		mine := lease.EventID{Millis: ms, Seq: seq}
		back, err := lease.ParseEventID(mine.String())
		if err != nil || back != mine {
			t.Fatalf("%+v written %q reads back as %+v, %v", mine, mine.String(), back, err)
		}
		if err == nil {
			want := cmpPair(id.Millis, id.Seq, ms, seq)
			if got := id.Compare(mine); got != want {
				t.Fatalf("%+v.Compare(%+v) = %d, want %d", id, mine, got, want)
			}
		}
		if ms == 1<<64-1 && seq == 1<<64-1 {
			return // the last id has no successor
		}
		if seq == 1<<64-1 && (nowMs <= 0 || uint64(nowMs) <= ms) {
			return // the next id of the same millisecond would overflow Seq
		}
		next := lease.NextEventID(mine, time.UnixMilli(nowMs))
		if next.Compare(mine) <= 0 || next.IsZero() {
			t.Fatalf("NextEventID(%s, %d ms) = %s, not after it", mine, nowMs, next)
		}
		if nowMs > 0 && uint64(nowMs) > ms && next != (lease.EventID{Millis: uint64(nowMs)}) {
			t.Fatalf("NextEventID(%s, %d ms) = %s, want %s-0", mine, nowMs, next, strconv.FormatInt(nowMs, 10))
		}
	})
}

func cmpPair(a1, a2, b1, b2 uint64) int {
	switch {
	case a1 != b1 && a1 < b1:
		return -1
	case a1 != b1:
		return 1
	case a2 < b2:
		return -1
	case a2 > b2:
		return 1
	}
	return 0
}
