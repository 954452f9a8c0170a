package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// maxTTLMs caps the ttlMs read from a request before it becomes a time.Duration (about 34 years:
// no overflow). The engine clamps it to the configured bounds anyway.
const maxTTLMs = 1 << 40

// Request bodies. Numbers are read as raw JSON so that fractions and out-of-range values are
// refused by intField rather than silently truncated.
type acquireBody struct {
	TabID  string          `json:"tabId"`
	Label  string          `json:"label"`
	TTLMs  json.RawMessage `json:"ttlMs,omitempty"`
	Hidden bool            `json:"hidden"`
	Mode   *lease.Mode     `json:"mode,omitempty"` // nil when left out (try)
	// NewEpoch: the holder's own acquire is a grant with a new epoch (lease.AcquireRequest.NewEpoch).
	NewEpoch bool `json:"newEpoch"`
}

type renewBody struct {
	TabID  string          `json:"tabId"`
	Epoch  json.RawMessage `json:"epoch,omitempty"`
	TTLMs  json.RawMessage `json:"ttlMs,omitempty"`
	Hidden bool            `json:"hidden"`
}

// decodeCompact is the compactDecoder of a renew body.
func (b *renewBody) decodeCompact(data []byte) bool {
	ok := compactInto(data, []compactField{{key: "tabId", str: &b.TabID}, {key: "epoch", number: &b.Epoch},
		{key: "ttlMs", number: &b.TTLMs}, {key: "hidden", boolean: &b.Hidden}})
	if !ok {
		*b = renewBody{}
	}
	return ok
}

// decodeCompact is the compactDecoder of an acquire body.
func (b *acquireBody) decodeCompact(data []byte) bool {
	var mode string
	var hasMode bool
	ok := compactInto(data, []compactField{{key: "tabId", str: &b.TabID}, {key: "label", str: &b.Label},
		{key: "ttlMs", number: &b.TTLMs}, {key: "hidden", boolean: &b.Hidden},
		{key: "mode", str: &mode, present: &hasMode}, {key: "newEpoch", boolean: &b.NewEpoch}})
	if !ok {
		*b = acquireBody{}
		return false
	}
	if hasMode {
		m := lease.Mode(mode)
		b.Mode = &m
	}
	return true
}

type releaseBody struct {
	TabID string          `json:"tabId"`
	Epoch json.RawMessage `json:"epoch,omitempty"`
	Gone  bool            `json:"gone"` // the tab is gone for good: no epoch (lease.ReleaseRequest.Gone)
}

// decodeCompact is the compactDecoder of a release body.
func (b *releaseBody) decodeCompact(data []byte) bool {
	ok := compactInto(data, []compactField{{key: "tabId", str: &b.TabID}, {key: "epoch", number: &b.Epoch},
		{key: "gone", boolean: &b.Gone}})
	if !ok {
		*b = releaseBody{}
	}
	return ok
}

// releaseAnswers are the two answers of a release, {"released":false} and {"released":true}, as
// encoding/json writes them, newline included.
var releaseAnswers = [2][]byte{[]byte(`{"released":false}` + "\n"), []byte(`{"released":true}` + "\n")}

// checkBody is {tabId, epoch} or {token} (see checkToken).
type checkBody struct {
	TabID string          `json:"tabId"`
	Epoch json.RawMessage `json:"epoch,omitempty"`
	Token *string         `json:"token,omitempty"`
}

// decodeCompact is the compactDecoder of a check body.
func (b *checkBody) decodeCompact(data []byte) bool {
	var token string
	var hasToken bool
	ok := compactInto(data, []compactField{{key: "tabId", str: &b.TabID}, {key: "epoch", number: &b.Epoch},
		{key: "token", str: &token, present: &hasToken}})
	if !ok {
		*b = checkBody{}
		return false
	}
	if hasToken {
		b.Token = &token
	}
	return true
}

// modeFrom is the mode of an acquire body: try when left out, else one of the modes by name.
func modeFrom(m *lease.Mode) (lease.Mode, error) {
	if m == nil {
		return lease.ModeTry, nil
	}
	if *m == "" { // lease.ValidateMode reads "" as the Go zero value, try
		return "", &lease.InvalidError{Field: "mode", Reason: `must be "try", "takeover" or "handoff" (or left out, for "try")`}
	}
	return lease.ValidateMode(*m)
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

func (s *Server) acquire(c echo.Context) (err error) {
	defer s.metrics.countInvalid("acquire", &err)
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
	mode, err := modeFrom(b.Mode)
	if err != nil {
		return err
	}
	ttl, err := ttlFrom(b.TTLMs)
	if err != nil {
		return err
	}
	l, err := s.engine.Acquire(c.Request().Context(), lease.AcquireRequest{
		Key:      key,
		Holder:   lease.Holder{TabID: b.TabID, Label: b.Label, Hidden: b.Hidden},
		TTL:      ttl,
		Mode:     mode,
		NewEpoch: b.NewEpoch,
	})
	s.metrics.observeOp("acquire", err)
	if err != nil {
		return err
	}
	return s.holderAnswer(c, l, b.TabID)
}

func (s *Server) renew(c echo.Context) (err error) {
	defer s.metrics.countInvalid("renew", &err)
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
	return s.holderAnswer(c, l, b.TabID)
}

func (s *Server) release(c echo.Context) (err error) {
	defer s.metrics.countInvalid("release", &err)
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
	var epoch int64
	if b.Gone {
		if b.Epoch != nil {
			return fieldError("epoch", "must be left out when gone is true: the tab's lease ends at whatever epoch")
		}
	} else if epoch, err = epochFrom(b.Epoch); err != nil {
		return err
	}
	req := lease.ReleaseRequest{Key: key, TabID: b.TabID, Epoch: epoch, Gone: b.Gone}
	res, err := s.engine.Release(c.Request().Context(), req)
	s.metrics.observeOp("release", err)
	if err != nil {
		s.gone.retry(req, err) // a page going away sends it once (goneretry.go)
		return err
	}
	answer := releaseAnswers[0]
	if res.Released {
		answer = releaseAnswers[1]
	}
	return c.JSONBlob(http.StatusOK, answer)
}

func (s *Server) get(c echo.Context) (err error) {
	defer s.metrics.countInvalid("get", &err)
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
	return writeLeaseAnswer(c, l, tabID, "", false)
}

func (s *Server) check(c echo.Context) (err error) {
	defer s.metrics.countInvalid("check", &err)
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
			return fieldError("token", "goes alone: give either {tabId, epoch} or {token}, not both")
		}
		l, claims, err := s.checkToken(c.Request().Context(), key, *b.Token)
		if err != nil {
			return err
		}
		return writeLeaseAnswer(c, l, claims.Tab, "", true)
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
	return writeLeaseAnswer(c, l, b.TabID, "", true)
}
