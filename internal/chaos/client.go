package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Client calls the lease API of tablease instances with one access token.
type Client struct {
	HTTP  *http.Client
	Token string
}

// Do makes the call in against the instance at base (http://host:port) for session sid and
// answers what it said. An answer that never came, a timeout and 503 STORE_UNAVAILABLE are an
// unknown outcome; an answer the contract does not allow for the call is an error (the outcome is
// then unknown too).
func (c *Client) Do(ctx context.Context, base, sid string, in Input) (Output, error) {
	path := base + "/v1/sessions/" + url.PathEscape(sid) + "/lease"
	var body any
	switch in.Kind {
	case Acquire:
		body = map[string]any{"tabId": in.Tab, "mode": "try"}
	case Takeover:
		body = map[string]any{"tabId": in.Tab, "mode": "takeover"}
	case NewEpoch:
		body = map[string]any{"tabId": in.Tab, "mode": "try", "newEpoch": true}
	case Renew, Release, Check:
		path += "/" + in.Kind.String()
		body = map[string]any{"tabId": in.Tab, "epoch": in.Epoch}
	case Get:
		path += "?tabId=" + url.QueryEscape(in.Tab)
	default:
		return Output{}, fmt.Errorf("chaos: no call for %s", in.Kind)
	}
	req, err := newRequest(ctx, path, body)
	if err != nil {
		return Output{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Output{Unknown: true}, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Output{Unknown: true}, nil
	}
	out, err := decode(in.Kind, resp.StatusCode, raw)
	if err != nil {
		return Output{Unknown: true}, fmt.Errorf("%s %s: %d %s: %w", req.Method, path, resp.StatusCode, raw, err)
	}
	return out, nil
}

func newRequest(ctx context.Context, path string, body any) (*http.Request, error) {
	if body == nil {
		return http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

type holderView struct {
	TabID string `json:"tabId"`
}

type leaseView struct {
	Held   bool        `json:"held"`
	Holder *holderView `json:"holder"`
	Epoch  int64       `json:"epoch"`
}

func (l leaseView) holder() string {
	if l.Holder == nil {
		return ""
	}
	return l.Holder.TabID
}

type errorView struct {
	Error struct {
		Code    string    `json:"code"`
		Details leaseView `json:"details"`
	} `json:"error"`
}

// decode reads an answer to a call of kind k.
func decode(k Kind, status int, raw []byte) (Output, error) {
	switch status {
	case http.StatusServiceUnavailable:
		return Output{Unknown: true}, nil
	case http.StatusOK:
		return decodeOK(k, raw)
	case http.StatusConflict:
		var e errorView
		if err := json.Unmarshal(raw, &e); err != nil {
			return Output{}, err
		}
		d := e.Error.Details
		switch {
		case e.Error.Code == "LEASE_HELD" && (k == Acquire || k == Takeover || k == NewEpoch):
			return Output{Result: Held, Holder: d.holder(), Epoch: d.Epoch}, nil
		case e.Error.Code == "LEASE_LOST" && (k == Renew || k == Check):
			return Output{Result: LostErr, Holder: d.holder(), Epoch: d.Epoch}, nil
		}
	}
	return Output{}, fmt.Errorf("the contract allows no such answer to %s", k)
}

func decodeOK(k Kind, raw []byte) (Output, error) {
	switch k {
	case Release:
		var r struct {
			Released *bool `json:"released"`
		}
		if err := json.Unmarshal(raw, &r); err != nil || r.Released == nil {
			return Output{}, fmt.Errorf("a release answer without released: %v", err)
		}
		if *r.Released {
			return Output{Result: Released}, nil
		}
		return Output{Result: Kept}, nil
	case Check:
		var r struct {
			Valid bool      `json:"valid"`
			Lease leaseView `json:"lease"`
		}
		if err := json.Unmarshal(raw, &r); err != nil || !r.Valid {
			return Output{}, fmt.Errorf("a check answer that is not valid: %v", err)
		}
		return Output{Result: Valid, Holder: r.Lease.holder(), Epoch: r.Lease.Epoch}, nil
	}
	var l leaseView
	if err := json.Unmarshal(raw, &l); err != nil {
		return Output{}, err
	}
	switch k {
	case Acquire, Takeover, NewEpoch:
		if !l.Held {
			return Output{}, fmt.Errorf("a granted lease that is not held")
		}
		return Output{Result: Granted, Holder: l.holder(), Epoch: l.Epoch}, nil
	case Renew:
		if !l.Held {
			return Output{}, fmt.Errorf("a renewed lease that is not held")
		}
		return Output{Result: Renewed, Holder: l.holder(), Epoch: l.Epoch}, nil
	}
	return Output{Result: Read, HeldNow: l.Held, Holder: l.holder(), Epoch: l.Epoch}, nil
}

// Ready waits until base answers 200 on /readyz, polling until ctx ends.
func Ready(ctx context.Context, hc *http.Client, base string) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is not ready: %w (last: %v)", base, ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
