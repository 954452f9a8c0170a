package stream

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/tablease/tablease/lease"
)

// # Event tickets
//
// A browser's EventSource cannot send an Authorization header, and access tokens are never read
// from URLs. A ticket opens one event stream instead: GET …/events?ticket=<ticket>. A ticket is
//
//	t2.<base64url(JSON {sub, sid, tab, exp (unix ms), until (unix ms), n (nonce)})>.<base64url(HMAC-SHA256)>
//
// The MAC (crypto/hmac) is over "t1." and the encoded claims, with the ticket key: a key derived
// from Options.TicketSecret, or from Config.HS256Secret, or generated per process. Derived keys
// are HMAC-SHA256(secret, "tablease event ticket key v1"), so a ticket is never a valid access
// token nor the reverse. A ticket is valid for TicketTTL, for its user, session and tab only, and
// once: the stream that redeems it records its nonce as used in Nonces (the store shared by
// every instance), until well after the ticket expires. until is when the access token the ticket
// was issued to stops being accepted: the stream ends then (Request.Until), as one opened with
// that token would. A reused, expired, forged, or foreign
// (other session, other tab) ticket is a *TicketError; store trouble while recording the nonce is
// the store's error.

// TicketTTL is how long an event ticket may be redeemed after it was issued.
const TicketTTL = 30 * time.Second

// MinTicketSecretLen is the shortest Options.TicketSecret accepted (32 bytes).
const MinTicketSecretLen = 32

const (
	ticketVersion = "t2"
	// maxTicketLen bounds a ticket before it is parsed: three identifiers, a time and a nonce.
	maxTicketLen = 1024
	// ticketKeyLabel separates the ticket key from every other use of the secret it is derived
	// from.
	ticketKeyLabel = "tablease event ticket key v1"
)

// TicketError refuses a ticket. Reason is a sentence for the client; it never holds the ticket.
type TicketError struct {
	Reason string
}

func (e *TicketError) Error() string { return "stream: " + e.Reason }

// The reasons of TicketError.
var (
	// ErrTicketInvalid refuses a ticket that is malformed, forged or signed with another key.
	ErrTicketInvalid = &TicketError{Reason: "the event ticket is not valid: malformed, or signed with another key (instances that share a store must share TABLEASE_TICKET_SECRET)"}
	errTicketExpired = &TicketError{Reason: "the event ticket has expired; ask for a new one"}
	errTicketUsed    = &TicketError{Reason: "the event ticket has been used already, or was issued before the store lost its data; ask for a new one"}
	errTicketSession = &TicketError{Reason: "the event ticket was issued for another session"}
	// ErrTicketTab refuses a ticket, or a stream request, that names another tab than the
	// ticket's.
	ErrTicketTab = &TicketError{Reason: "the event ticket was issued for another tab"}
)

// Nonces remembers single-use values for a while, so that a ticket is redeemed once across every
// instance that shares the store, and hands them out tied to the store's generation, so that a
// ticket used before the store lost its data is not accepted again after it. The Redis engine is
// one; leasemem.NonceStore is one for a single instance; leasetest.RunNonces checks them (the
// contract is leasetest.NonceStore's).
type Nonces interface {
	// NewNonce answers a new nonce of the store's current generation. Errors:
	// *lease.UnavailableError for store trouble.
	NewNonce(ctx context.Context) (string, error)
	// UseNonce records nonce as used for ttl, in one atomic step of the store, and reports whether
	// it was fresh: true for the first use of a nonce of the current generation, false while an
	// earlier use is remembered or for a nonce of another generation. Of many
	// concurrent uses of one nonce, exactly one is fresh. After ttl (by the store's clock) the
	// nonce is forgotten. Errors: *lease.InvalidError for a nonce that is not an identifier or a
	// ttl not in [1ms, lease.MaxNonceTTL]; *lease.UnavailableError for store trouble, which never
	// answers fresh.
	UseNonce(ctx context.Context, nonce string, ttl time.Duration) (fresh bool, err error)
}

// ticketBook issues and redeems event tickets. It is immutable after newTicketBook.
type ticketBook struct {
	key    []byte
	nonces Nonces
	now    func() time.Time
}

// newTicketBook derives the ticket key: from secret when given, else from hs256 when given, else
// from a random key (tickets then work on this instance only).
func newTicketBook(secret, hs256 []byte, nonces Nonces, now func() time.Time) *ticketBook {
	base := secret
	if len(base) == 0 {
		base = hs256
	}
	if len(base) == 0 {
		base = make([]byte, 32)
		_, _ = rand.Read(base) // never fails (Go 1.24+)
	}
	mac := hmac.New(sha256.New, base)
	mac.Write([]byte(ticketKeyLabel))
	return &ticketBook{key: mac.Sum(nil), nonces: nonces, now: now}
}

// Ticket is what a redeemed ticket grants: a stream of session Sid of user Sub, for tab Tab.
type Ticket struct {
	Sub   string `json:"sub"`
	Sid   string `json:"sid"`
	Tab   string `json:"tab"`
	Exp   int64  `json:"exp"`   // unix milliseconds
	Until int64  `json:"until"` // unix milliseconds: the end of the issuing credential
	Nonce string `json:"n"`
}

var b64 = base64.RawURLEncoding

func (b *ticketBook) sign(signed string) []byte {
	mac := hmac.New(sha256.New, b.key)
	mac.Write([]byte(signed))
	return mac.Sum(nil)
}

// IssueTicket makes a ticket for tab of key, valid for TicketTTL from now and no longer than
// until, the end of the credential it is issued to, and answers it with how long it is valid. Its
// nonce comes from the store (a *lease.UnavailableError when the store does not answer).
func (h *Handler) IssueTicket(ctx context.Context, key lease.Key, tab string, until time.Time) (string, time.Duration, error) {
	b := h.tickets
	nonce, err := b.nonces.NewNonce(ctx)
	h.storeCall("new_nonce", err)
	if err != nil {
		return "", 0, err
	}
	now := b.now()
	exp := now.Add(TicketTTL)
	if until.Before(exp) {
		exp = until
	}
	claims := Ticket{Sub: key.User, Sid: key.Session, Tab: tab, Exp: exp.UnixMilli(), Until: until.UnixMilli(), Nonce: nonce}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", 0, err
	}
	signed := ticketVersion + "." + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(b.sign(signed)), max(exp.Sub(now), 0), nil
}

// RedeemTicket checks ticket for session sid and tab tabID (any tab when empty), and records it as
// used. It answers the ticket's claims, a *TicketError, or the store's error (the store's part is
// reported to Config.StoreCall). A ticket refused for any reason but reuse is not used up.
func (h *Handler) RedeemTicket(ctx context.Context, ticket, sid, tabID string) (Ticket, error) {
	t, err := h.tickets.redeem(ctx, ticket, sid, tabID)
	if _, ok := err.(*TicketError); !ok {
		h.storeCall("use_nonce", err)
	}
	return t, err
}

func (b *ticketBook) redeem(ctx context.Context, ticket, sid, tabID string) (Ticket, error) {
	var claims Ticket
	if len(ticket) > maxTicketLen {
		return claims, ErrTicketInvalid
	}
	version, rest, ok1 := strings.Cut(ticket, ".")
	payloadB64, macB64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || version != ticketVersion {
		return claims, ErrTicketInvalid
	}
	// Only the one spelling of the MAC that IssueTicket writes: the decoder skips CR and LF and
	// ignores the unused bits of the last character, so other strings decode to the same bytes.
	mac, err := b64.DecodeString(macB64)
	if err != nil || b64.EncodeToString(mac) != macB64 || !hmac.Equal(mac, b.sign(ticket[:len(version)+1+len(payloadB64)])) {
		return claims, ErrTicketInvalid
	}
	payload, err := b64.DecodeString(payloadB64)
	if err != nil {
		return claims, ErrTicketInvalid
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&claims); err != nil ||
		lease.ValidateID("sub", claims.Sub) != nil || lease.ValidateID("sid", claims.Sid) != nil ||
		lease.ValidateID("tab", claims.Tab) != nil || lease.ValidateID("nonce", claims.Nonce) != nil {
		return claims, ErrTicketInvalid // signed by us, so only a key shared with something else
	}
	now := b.now()
	exp := time.UnixMilli(claims.Exp)
	switch {
	case claims.Until < claims.Exp: // IssueTicket never writes one
		return claims, ErrTicketInvalid
	case !exp.After(now):
		return claims, errTicketExpired
	case exp.Sub(now) > TicketTTL+time.Minute: // issued by a clock far ahead: refuse rather than trust
		return claims, ErrTicketInvalid
	case claims.Sid != sid:
		return claims, errTicketSession
	case tabID != "" && claims.Tab != tabID:
		return claims, ErrTicketTab
	}
	// Remembered well past the expiry, so that an instance whose clock runs behind cannot accept
	// it again after the store forgot it.
	fresh, err := b.nonces.UseNonce(ctx, claims.Nonce, min(exp.Sub(now)+TicketTTL+time.Minute, lease.MaxNonceTTL))
	if err != nil {
		return claims, err
	}
	if !fresh {
		return claims, errTicketUsed
	}
	return claims, nil
}
