package socket

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// echoConfig is a Config whose calls answer their body.
func echoConfig() Config {
	return testConfig(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		_, _ = w.Write(b.Bytes())
	})
}

// idleHandler is a Handler of echoConfig with opts whose sockets go idle after linger.
func idleHandler(t *testing.T, opts Options, linger time.Duration) *Handler {
	t.Helper()
	cfg := echoConfig()
	cfg.Options = opts
	cfg.Options.Linger = linger
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

// heldConn is a client connection whose writes, while held, are kept and then sent in one write
// (release): the messages written meanwhile reach the server together.
type heldConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  bytes.Buffer
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		return c.buf.Write(p)
	}
	return c.Conn.Write(p)
}

func (c *heldConn) hold() { c.mu.Lock(); c.held = true; c.mu.Unlock() }

func (c *heldConn) release(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	if _, err := c.Conn.Write(c.buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.buf.Reset()
}

// dialHeld opens a socket to url through a heldConn, authenticated as alice.
func dialHeld(t *testing.T, url string) (*websocket.Conn, *heldConn) {
	t.Helper()
	var hc *heldConn
	d := websocket.Dialer{NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc = &heldConn{Conn: c}
		return hc, nil
	}}
	conn, _, err := d.Dial(url+"/v1/socket", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	send(t, conn, `{"id":0,"op":"auth","token":"alice"}`)
	if got := read(t, conn); !strings.Contains(got, `"status":200`) {
		t.Fatalf("auth answered %s", got)
	}
	return conn, hc
}

// waitIdle waits until a socket of the process waits for its next message in a goroutine that a
// socket's goroutine started as it went idle (run), other than the goroutine not, and answers it
// (its number, as runtime.Stack names it).
func waitIdle(t *testing.T, not string) string {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			id, _, _ := strings.Cut(g, " [")
			if id != not && strings.Contains(g, "api/socket.awaitReadable") &&
				strings.Contains(g, "created by github.com/tablease/tablease/api/socket.(*socket).run") {
				return id
			}
		}
	}
	t.Fatal("no socket went idle in a goroutine of its own within 10 s")
	return ""
}

// renews sends n calls (ids first..first+n-1) and checks their answers, in order.
func renews(t *testing.T, conn *websocket.Conn, hc *heldConn, first, n int, together bool) {
	t.Helper()
	if together {
		hc.hold()
	}
	for i := first; i < first+n; i++ {
		send(t, conn, `{"id":`+strconv.Itoa(i)+`,"op":"renew","sid":"s1","body":{"n":`+strconv.Itoa(i)+`}}`)
	}
	if together {
		hc.release(t)
	}
	for i := first; i < first+n; i++ {
		want := `{"id":` + strconv.Itoa(i) + `,"status":200,"body":{"n":` + strconv.Itoa(i) + `}}`
		if got := read(t, conn); got != want {
			t.Fatalf("call %d answered %s, want %s", i, got, want)
		}
	}
}

// TestMessagesSentTogetherAreAllAnswered: messages that reach the server in one packet (read into
// gorilla/websocket's buffer together) are answered at once, in order, whether the socket lingers
// in the goroutine of its last call or waits idle in a new one; so are messages sent one by one,
// and a message sent after the socket went idle.
func TestMessagesSentTogetherAreAllAnswered(t *testing.T) {
	for _, linger := range []time.Duration{time.Hour, 10 * time.Millisecond} {
		t.Run("linger "+linger.String(), func(t *testing.T) {
			h := idleHandler(t, Options{}, linger)
			conn, hc := dialHeld(t, serve(t, h))
			renews(t, conn, hc, 1, 3, true)
			renews(t, conn, hc, 4, 2, false)
			if linger < time.Hour {
				idle := waitIdle(t, "")
				renews(t, conn, hc, 6, 5, true)
				waitIdle(t, idle)
			}
			renews(t, conn, hc, 11, 1, false)
		})
	}
}

// TestAnIdleSocketAnswersPingsAndLongMessages: a socket waiting idle answers a ping, and a message
// longer than its read buffer, sent in fragments, as the calls that follow.
func TestAnIdleSocketAnswersPingsAndLongMessages(t *testing.T) {
	h := idleHandler(t, Options{}, 10*time.Millisecond)
	conn, hc := dialHeld(t, serve(t, h))
	waitIdle(t, "")
	pong := make(chan string, 1)
	conn.SetPongHandler(func(data string) error { pong <- data; return nil })
	if err := conn.WriteControl(websocket.PingMessage, []byte("hi"), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	// The pong comes while the next read waits for the answer to the call.
	long := strings.Repeat("x", 3*readBufferSize)
	w, err := conn.NextWriter(websocket.TextMessage)
	if err != nil {
		t.Fatal(err)
	}
	msg := `{"id":"long","op":"renew","sid":"s1","body":{"pad":"` + long + `"}}`
	for i := 0; i < len(msg); i += 1000 { // fragments of the client's own making
		if _, err := w.Write([]byte(msg[i:min(i+1000, len(msg))])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, conn), `{"id":"long","status":200,"body":{"pad":"`+long+`"}}`; got != want {
		t.Fatalf("the long message answered %.80s…, want %.80s…", got, want)
	}
	select {
	case got := <-pong:
		if got != "hi" {
			t.Fatalf("pong %q, want hi", got)
		}
	default:
		t.Fatal("no pong came before the answer to the call sent after the ping")
	}
	renews(t, conn, hc, 1, 2, true)
}

// TestAnIdleSocketKeepsItsTimeoutsAndShutdown: a socket waiting idle closes as the socket it was
// would: with 1008 when no auth message came within the auth timeout, with 1000 "idle" after the
// idle timeout, and with 1001 when the instance closes.
func TestAnIdleSocketKeepsItsTimeoutsAndShutdown(t *testing.T) {
	closeOf := func(t *testing.T, conn *websocket.Conn) *websocket.CloseError {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _, err := conn.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("read %v, want a close", err)
		}
		return ce
	}
	t.Run("auth", func(t *testing.T) {
		h := idleHandler(t, Options{AuthTimeout: 300 * time.Millisecond}, 10*time.Millisecond)
		conn, _, err := websocket.DefaultDialer.Dial(serve(t, h)+"/v1/socket", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if ce := closeOf(t, conn); ce.Code != websocket.ClosePolicyViolation {
			t.Fatalf("closed with %d %q, want 1008", ce.Code, ce.Text)
		}
	})
	t.Run("idle", func(t *testing.T) {
		h := idleHandler(t, Options{IdleTimeout: 300 * time.Millisecond}, 10*time.Millisecond)
		conn, hc := dialHeld(t, serve(t, h))
		renews(t, conn, hc, 1, 1, false)
		if ce := closeOf(t, conn); ce.Code != websocket.CloseNormalClosure || ce.Text != "idle" {
			t.Fatalf("closed with %d %q, want 1000 idle", ce.Code, ce.Text)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		h := idleHandler(t, Options{}, 10*time.Millisecond)
		conn, _ := dialHeld(t, serve(t, h))
		waitIdle(t, "")
		closed := make(chan struct{})
		go func() { h.Close(context.Background()); close(closed) }()
		if ce := closeOf(t, conn); ce.Code != websocket.CloseGoingAway {
			t.Fatalf("closed with %d %q, want 1001", ce.Code, ce.Text)
		}
		<-closed
		if h.Open() != 0 {
			t.Fatalf("%d sockets open after Close", h.Open())
		}
	})
}

// TestAMessageMayArriveSlowlyWhileTheSocketLingers: a message whose first bytes come while the
// socket lingers (the connection's read deadline is then the end of the linger) has until the idle
// timeout for the rest, as any message.
func TestAMessageMayArriveSlowlyWhileTheSocketLingers(t *testing.T) {
	h := idleHandler(t, Options{}, 200*time.Millisecond)
	conn, hc := dialHeld(t, serve(t, h))
	hc.hold()
	send(t, conn, `{"id":1,"op":"renew","sid":"s1","body":{"n":1}}`)
	hc.mu.Lock()
	frame := bytes.Clone(hc.buf.Bytes())
	hc.buf.Reset()
	hc.held = false
	hc.mu.Unlock()
	if _, err := hc.Conn.Write(frame[:10]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the rest comes after the end of the linger
	if _, err := hc.Conn.Write(frame[10:]); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, conn), `{"id":1,"status":200,"body":{"n":1}}`; got != want {
		t.Fatalf("the call answered %s, want %s", got, want)
	}
}
