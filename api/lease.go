package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner"
)

// maxTTLMs caps the ttlMs read from a request before it becomes a time.Duration (about 34 years:
// no overflow). The engine clamps it to the configured bounds anyway.
const maxTTLMs = 1 << 40

// timeLayout is RFC 3339 in UTC with milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// leaseJSON is the lease object of DESIGN §3.
type leaseJSON struct {
	SessionID    string      `json:"sessionId"`
	Held         bool        `json:"held"`
	Holder       *holderJSON `json:"holder"`    // null when free
	Epoch        int64       `json:"epoch"`     // the last epoch when free; 0 when never granted
	GrantedAt    *string     `json:"grantedAt"` // null when never granted
	ExpiresAt    *string     `json:"expiresAt"` // null when never granted
	TTLMs        int64       `json:"ttlMs"`
	RemainingMs  int64       `json:"remainingMs"`
	RenewAfterMs int64       `json:"renewAfterMs"`
	Transitions  int64       `json:"transitions"`
	Role         string      `json:"role,omitempty"` // only when the request named a tabId
	// Handoff is the handoff in progress: requested (the holder was asked to let go) or reserved
	// (the lease is free and kept for the requester); absent when there is none.
	Handoff *handoffJSON `json:"handoff,omitempty"`
	// BlockedUntil is when an admin's block of the session ends (grants are refused with
	// SESSION_BLOCKED until then); null when no block is in force.
	BlockedUntil *string `json:"blockedUntil"`
	// Token is the lease token, only in answers to the holder (acquire, renew).
	Token string `json:"token,omitempty"`
}

type holderJSON struct {
	TabID  string `json:"tabId"`
	Label  string `json:"label"`
	Hidden bool   `json:"hidden"`
}

type handoffJSON struct {
	State       string      `json:"state"` // "requested" or "reserved"
	Requester   *holderJSON `json:"requester"`
	Until       *string     `json:"until"`
	RemainingMs int64       `json:"remainingMs"`
}

// handoffView renders the handoff of l as of l.Now; nil when none is in progress.
func handoffView(l lease.Lease) *handoffJSON {
	h := l.Handoff
	if h == nil || !h.Until.After(l.Now) {
		return nil
	}
	state := "requested"
	if h.Reserved {
		state = "reserved"
	}
	return &handoffJSON{State: state, Requester: holderView(h.Requester), Until: timeView(h.Until), RemainingMs: h.Until.Sub(l.Now).Milliseconds()}
}

// blockedUntilView renders the end of the block of l as of l.Now; nil when none is in force.
func blockedUntilView(l lease.Lease) *string {
	if !l.BlockedUntil.After(l.Now) {
		return nil
	}
	return timeView(l.BlockedUntil)
}

func holderView(h lease.Holder) *holderJSON {
	return &holderJSON{TabID: h.TabID, Label: h.Label, Hidden: h.Hidden}
}

func timeView(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(timeLayout)
	return &s
}

// leaseView renders l; tabID, when not empty, adds the role of that tab.
func leaseView(l lease.Lease, tabID string) *leaseJSON {
	out := &leaseJSON{
		SessionID:    l.Key.Session,
		Held:         l.Held,
		Epoch:        l.Epoch,
		GrantedAt:    timeView(l.GrantedAt),
		ExpiresAt:    timeView(l.ExpiresAt),
		TTLMs:        l.TTL.Milliseconds(),
		RemainingMs:  l.Remaining().Milliseconds(),
		RenewAfterMs: lease.RenewAfter(l.TTL).Milliseconds(),
		Transitions:  l.Transitions,
		Handoff:      handoffView(l),
		BlockedUntil: blockedUntilView(l),
	}
	if l.Held {
		out.Holder = holderView(l.Holder)
	}
	if tabID != "" {
		out.Role = string(owner.RoleFor(l, tabID))
	}
	return out
}

// Request bodies. Numbers are read as raw JSON so that fractions and out-of-range values are
// refused by intField rather than silently truncated.
type acquireBody struct {
	TabID  string          `json:"tabId"`
	Label  string          `json:"label"`
	TTLMs  json.RawMessage `json:"ttlMs"`
	Hidden bool            `json:"hidden"`
	Mode   lease.Mode      `json:"mode"`
}

type renewBody struct {
	TabID  string          `json:"tabId"`
	Epoch  json.RawMessage `json:"epoch"`
	TTLMs  json.RawMessage `json:"ttlMs"`
	Hidden bool            `json:"hidden"`
}

type releaseBody struct {
	TabID string          `json:"tabId"`
	Epoch json.RawMessage `json:"epoch"`
}

// checkBody is {tabId, epoch} or {token} (see checkToken).
type checkBody struct {
	TabID string          `json:"tabId"`
	Epoch json.RawMessage `json:"epoch"`
	Token *string         `json:"token"`
}

// key is the lease key of the request: the token's sub and the path's sid.
func (s *Server) key(c echo.Context) (lease.Key, error) {
	p := principalOf(c)
	if p == nil { // authenticate did not run: a wiring bug
		return lease.Key{}, &Error{Code: CodeInternal, Message: "internal error"}
	}
	sid := pathParam(c, "sid")
	if err := lease.ValidateID("sessionId", sid); err != nil {
		return lease.Key{}, err
	}
	return lease.Key{User: p.Sub, Session: sid}, nil
}

func validTabID(tabID string) error { return lease.ValidateID("tabId", tabID) }

func ttlFrom(raw json.RawMessage) (time.Duration, error) {
	ms, _, err := intField("ttlMs", raw)
	if err != nil {
		return 0, err
	}
	if ms < 0 {
		return 0, fieldError("ttlMs", "must not be negative")
	}
	return time.Duration(min(ms, maxTTLMs)) * time.Millisecond, nil
}

func epochFrom(raw json.RawMessage) (int64, error) {
	v, present, err := intField("epoch", raw)
	if err != nil {
		return 0, fieldError("epoch", "must be an integer in [1, 2^53)")
	}
	if !present {
		return 0, fieldError("epoch", "is required")
	}
	if err := lease.ValidateEpoch(v); err != nil {
		return 0, err
	}
	return v, nil
}

func (s *Server) acquire(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	var b acquireBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	if err := validTabID(b.TabID); err != nil {
		return err
	}
	if err := lease.ValidateLabel(b.Label); err != nil {
		return err
	}
	mode, err := lease.ValidateMode(b.Mode)
	if err != nil {
		return err
	}
	ttl, err := ttlFrom(b.TTLMs)
	if err != nil {
		return err
	}
	l, err := s.engine.Acquire(c.Request().Context(), lease.AcquireRequest{
		Key:    key,
		Holder: lease.Holder{TabID: b.TabID, Label: b.Label, Hidden: b.Hidden},
		TTL:    ttl,
		Mode:   mode,
	})
	s.metrics.observeOp("acquire", err)
	if err != nil {
		return err
	}
	out, err := s.holderAnswer(l, b.TabID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) renew(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	var b renewBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	if err := validTabID(b.TabID); err != nil {
		return err
	}
	epoch, err := epochFrom(b.Epoch)
	if err != nil {
		return err
	}
	ttl, err := ttlFrom(b.TTLMs)
	if err != nil {
		return err
	}
	l, err := s.engine.Renew(c.Request().Context(), lease.RenewRequest{
		Key: key, TabID: b.TabID, Epoch: epoch, TTL: ttl, Hidden: b.Hidden,
	})
	s.metrics.observeOp("renew", err)
	if err != nil {
		return err
	}
	out, err := s.holderAnswer(l, b.TabID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) release(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	var b releaseBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	if err := validTabID(b.TabID); err != nil {
		return err
	}
	epoch, err := epochFrom(b.Epoch)
	if err != nil {
		return err
	}
	res, err := s.engine.Release(c.Request().Context(), lease.ReleaseRequest{Key: key, TabID: b.TabID, Epoch: epoch})
	s.metrics.observeOp("release", err)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]bool{"released": res.Released})
}

func (s *Server) get(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	tabID := c.QueryParam("tabId") // empty means not given: no role in the answer
	if tabID != "" {
		if err := validTabID(tabID); err != nil {
			return err
		}
	}
	l, err := s.engine.Get(c.Request().Context(), key)
	s.metrics.observeOp("get", err)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, leaseView(l, tabID))
}

type checkJSON struct {
	Valid bool       `json:"valid"`
	Lease *leaseJSON `json:"lease"`
}

func (s *Server) check(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	var b checkBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	if b.Token != nil {
		if b.TabID != "" || len(b.Epoch) > 0 {
			return errInvalid("give either {tabId, epoch} or {token}, not both")
		}
		l, claims, err := s.checkToken(c.Request().Context(), key, *b.Token)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, checkJSON{Valid: true, Lease: leaseView(l, claims.Tab)})
	}
	if err := validTabID(b.TabID); err != nil {
		return err
	}
	epoch, err := epochFrom(b.Epoch)
	if err != nil {
		return err
	}
	l, err := s.engine.Check(c.Request().Context(), key, b.TabID, epoch)
	s.metrics.observeOp("check", err)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, checkJSON{Valid: true, Lease: leaseView(l, b.TabID)})
}
