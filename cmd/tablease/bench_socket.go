package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tablease/tablease/api"
)

// benchSocket is the lease socket of one bench user (--transport socket): its calls take turns.
type benchSocket struct {
	mu   sync.Mutex
	conn *websocket.Conn
	next int64 // id of the next message
}

// socketAnswer is what the bench reads of a socket's answer.
type socketAnswer struct {
	Status int         `json:"status"`
	Body   leaseAnswer `json:"body"`
}

// callSocket makes the call op with body over sub's socket, which it opens, authenticated with
// tok, at sub's first call.
func (b *bench) callSocket(ctx context.Context, sub, tok, op, sid string, body []byte) (leaseAnswer, error) {
	s, err := b.socket(ctx, sub, tok)
	if err != nil {
		return leaseAnswer{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.exchange(ctx, `{"id":`+strconv.FormatInt(s.next, 10)+`,"op":"`+op+`","sid":"`+sid+`","body":`+string(body)+`}`)
	switch {
	case err != nil:
		return leaseAnswer{}, fmt.Errorf("%s over the socket: %w", op, err)
	case a.Status != http.StatusOK:
		code := "?"
		if a.Body.Error != nil {
			code = a.Body.Error.Code
		}
		return a.Body, fmt.Errorf("%s over the socket: %d %s", op, a.Status, code)
	}
	return a.Body, nil
}

// exchange sends msg and reads its answer; s.mu is held.
func (s *benchSocket) exchange(ctx context.Context, msg string) (socketAnswer, error) {
	s.next++
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = s.conn.SetWriteDeadline(deadline)
	if err := s.conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		return socketAnswer{}, err
	}
	_ = s.conn.SetReadDeadline(deadline)
	_, data, err := s.conn.ReadMessage()
	if err != nil {
		return socketAnswer{}, err
	}
	var a socketAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return socketAnswer{}, fmt.Errorf("answer not JSON: %w", err)
	}
	return a, nil
}

// socket is sub's socket, opened and authenticated with tok at its first use.
func (b *bench) socket(ctx context.Context, sub, tok string) (*benchSocket, error) {
	b.mu.Lock()
	s, ok := b.sockets[sub]
	if !ok {
		s = &benchSocket{}
		b.sockets[sub] = s
	}
	b.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		return s, nil
	}
	conn, res, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(b.url, "http")+"/v1/socket", nil)
	if err != nil {
		if res != nil {
			return nil, fmt.Errorf("opening a socket: %w (status %d)", err, res.StatusCode)
		}
		return nil, fmt.Errorf("opening a socket: %w", err)
	}
	s.conn = conn
	a, err := s.exchange(ctx, `{"id":0,"op":"auth","token":"`+tok+`"}`)
	if err == nil && a.Status != http.StatusOK {
		err = fmt.Errorf("status %d", a.Status)
	}
	if err != nil {
		_ = conn.Close()
		s.conn = nil
		return nil, fmt.Errorf("authenticating a socket: %w", err)
	}
	return s, nil
}

// closeSockets closes the sockets the bench opened.
func (b *bench) closeSockets() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.sockets {
		s.mu.Lock()
		if s.conn != nil {
			_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			_ = s.conn.Close()
		}
		s.mu.Unlock()
	}
}

// socketsSettleMore is how much longer than a socket's linger (api.SocketLinger) the idle sockets
// work lets the server's sockets idle before it reads the server's RSS.
const socketsSettleMore = time.Second

// idleSocketsRSS opens --sockets lease sockets, one per user, each authenticated and with one
// acquire made over it (a tab's socket after its first call; of the server's default TTL),
// lets them idle past the time a socket keeps the goroutine of its last call (api.SocketLinger of
// the TTL that acquire answers), and reports the server's RSS per idle socket. Then it
// releases the leases, so that the works after it find none held that would expire as they
// measure. The sockets stay open until the bench ends, as those of the other works do.
func (b *bench) idleSocketsRSS(ctx context.Context) ([]benchResult, error) {
	rss0, rssErr := b.rss("tablease")
	body := []byte(`{"tabId":"t"}`)
	var ttl time.Duration // the server's default
	sid := b.prefix + "-idle-socket"
	epochs := make([]int64, b.idleSockets)
	defer func() {
		for i, e := range epochs {
			if e != 0 {
				sub := b.prefix + "-k" + strconv.Itoa(i)
				tok, _ := b.token(sub)
				_, _ = b.callSocket(context.WithoutCancel(ctx), sub, tok, "release", sid, []byte(`{"tabId":"t","epoch":`+strconv.FormatInt(e, 10)+`}`))
			}
		}
	}()
	for i := range b.idleSockets {
		sub := b.prefix + "-k" + strconv.Itoa(i)
		tok, err := b.token(sub)
		if err != nil {
			return nil, err
		}
		a, err := b.callSocket(ctx, sub, tok, "acquire", sid, body)
		if err != nil {
			return nil, fmt.Errorf("idle socket %d: %w", i+1, err)
		}
		epochs[i], ttl = a.Epoch, time.Duration(a.TTLMs)*time.Millisecond
		if (i+1)%500 == 0 || i+1 == b.idleSockets {
			fmt.Fprintf(b.progress, "\r%-16s %d/%d open   ", "idle sockets", i+1, b.idleSockets)
		}
	}
	if b.idleSockets < minRSSCount {
		// The heap's own ups and downs, hundreds of KB, would be most of the figure.
		return []benchResult{{Work: "idle sockets", Ops: int64(b.idleSockets),
			Note: fmt.Sprintf("tablease RSS per idle lease socket: not measured below %d sockets", minRSSCount)}}, nil
	}
	settle := api.SocketLinger(ttl) + socketsSettleMore
	fmt.Fprintf(b.progress, "\r%-16s %d/%d open, idle for %s   ", "idle sockets", b.idleSockets, b.idleSockets, settle)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rss1, err := b.rss("tablease")
	if err != nil || rssErr != nil {
		return nil, nil
	}
	r := benchResult{Work: "idle sockets", Ops: int64(b.idleSockets), Note: "tablease RSS per idle lease socket", Bytes: float64(rss1-rss0) / float64(b.idleSockets)}
	return []benchResult{r}, nil
}
