package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner"
)

// The lease object of DESIGN §3 as the frequent answers write it (acquire, renew, check, get):
// appended straight into one buffer, byte for byte what encoding/json makes of leaseView's struct
// and the answer around it (TestLeaseAnswersAreTheirViewsEncoded holds the two together), without
// the encoder's reflection and the view's allocations, which took ~7 % of tablease's CPU per
// renew. leaseJSON (views.go) stays the lease object's one description: the other answers that
// carry it (stream snapshots, admin listings) encode it.

// answerBufs keeps the buffers of answers between requests; one that grew past 16 KiB is let go.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// writeLeaseAnswer answers c with 200 and the lease object of l: with the role of tabID when it is
// not empty and token when it is not empty, and within {"valid":true,"lease":…} when check is set
// (the answer of POST …/lease/check).
func writeLeaseAnswer(c echo.Context, l lease.Lease, tabID, token string, check bool) error {
	bp := answerBufs.Get().(*[]byte)
	b := (*bp)[:0]
	if check {
		b = append(b, `{"valid":true,"lease":`...)
	}
	b = appendLease(b, l, tabID, token)
	if check {
		b = append(b, '}')
	}
	b = append(b, '\n') // as json.Encoder ends each value
	err := c.Blob(http.StatusOK, echo.MIMEApplicationJSON, b)
	if cap(b) <= 16<<10 {
		*bp = b
		answerBufs.Put(bp)
	}
	return err
}

// appendLease appends the JSON of leaseView(l, tabID) with Token set to token.
func appendLease(b []byte, l lease.Lease, tabID, token string) []byte {
	b = append(b, `{"sessionId":`...)
	b = appendString(b, l.Key.Session)
	b = append(b, `,"held":`...)
	b = strconv.AppendBool(b, l.Held)
	b = append(b, `,"holder":`...)
	if l.Held {
		b = appendHolder(b, l.Holder)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"epoch":`...)
	b = strconv.AppendInt(b, l.Epoch, 10)
	b = append(b, `,"grantedAt":`...)
	b = appendTime(b, l.GrantedAt)
	b = append(b, `,"expiresAt":`...)
	b = appendTime(b, l.ExpiresAt)
	b = append(b, `,"ttlMs":`...)
	b = strconv.AppendInt(b, l.TTL.Milliseconds(), 10)
	b = append(b, `,"remainingMs":`...)
	b = strconv.AppendInt(b, l.Remaining().Milliseconds(), 10)
	b = append(b, `,"renewAfterMs":`...)
	b = strconv.AppendInt(b, lease.RenewAfter(l.TTL).Milliseconds(), 10)
	b = append(b, `,"transitions":`...)
	b = strconv.AppendInt(b, l.Transitions, 10)
	if tabID != "" {
		b = append(b, `,"role":`...)
		b = appendString(b, string(owner.RoleFor(l, tabID)))
	}
	if h := handoffShown(l); h != nil {
		b = append(b, `,"handoff":{"state":"`...)
		b = append(b, handoffState(h)...)
		b = append(b, `","requester":`...)
		b = appendHolder(b, h.Requester)
		b = append(b, `,"until":`...)
		b = appendTime(b, h.Until)
		b = append(b, `,"remainingMs":`...)
		b = strconv.AppendInt(b, h.Until.Sub(l.Now).Milliseconds(), 10)
		b = append(b, '}')
	}
	b = append(b, `,"blockedUntil":`...)
	if blockInForce(l) {
		b = appendTime(b, l.BlockedUntil)
	} else {
		b = append(b, "null"...)
	}
	if token != "" {
		b = append(b, `,"token":`...)
		b = appendString(b, token)
	}
	return append(b, '}')
}

func appendHolder(b []byte, h lease.Holder) []byte {
	b = append(b, `{"tabId":`...)
	b = appendString(b, h.TabID)
	b = append(b, `,"label":`...)
	b = appendString(b, h.Label)
	b = append(b, `,"hidden":`...)
	b = strconv.AppendBool(b, h.Hidden)
	return append(b, '}')
}

// appendTime appends timeView(t) encoded: null for the zero time.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, timeLayout)
	return append(b, '"')
}

// appendString appends s as encoding/json quotes it: as it is when it needs no escape (ids,
// tokens, most labels), else by encoding/json itself (HTML characters, control characters,
// anything not ASCII).
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
