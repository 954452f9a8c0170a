package socket

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// testConfig is a Config whose calls are served by dispatch, and whose tokens are their user.
func testConfig(dispatch http.HandlerFunc) Config {
	return Config{
		Dispatch: dispatch,
		Verify: func(_ context.Context, token, _ string) (string, time.Time, error) {
			return token, time.Now().Add(time.Hour), nil
		},
		Decode: func(data []byte, m *Message) error { return json.Unmarshal(data, m) },
		Answer: func(err error) (int, []byte, string) {
			body, _ := json.Marshal(map[string]string{"error": err.Error()})
			return http.StatusBadRequest, body, ""
		},
		CheckOrigin: func(*http.Request) bool { return false },
	}
}

func serve(t *testing.T, h *Handler) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.Serve(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusTeapot)
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func send(t *testing.T, conn *websocket.Conn, msg string) {
	t.Helper()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, conn *websocket.Conn) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := conn.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestCloseAnswersTheCallInFlight: a socket serving a call when the instance closes answers it,
// then closes with 1001; Close waits for that.
func TestCloseAnswersTheCallInFlight(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	h, err := New(testConfig(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer alice" || r.URL.Path != "/v1/sessions/s1/lease/renew" || r.Method != http.MethodPost {
			http.Error(w, "wrong request", http.StatusInternalServerError)
			return
		}
		close(started)
		<-finish
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":{"code":"LEASE_LOST"}}` + "\n"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := websocket.DefaultDialer.Dial(serve(t, h)+"/v1/socket", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send(t, conn, `{"id":1,"op":"auth","token":"alice"}`)
	if got := read(t, conn); !strings.Contains(got, `"status":200`) || !strings.Contains(got, `"sub":"alice"`) {
		t.Fatalf("auth answered %s", got)
	}
	send(t, conn, `{"id":"r","op":"renew","sid":"s1","body":{"tabId":"t"}}`)
	<-started
	closed := make(chan struct{})
	go func() { h.Close(context.Background()); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a call was being served")
	case <-time.After(50 * time.Millisecond): // a bound on a wrong early return, not a synchronisation
	}
	close(finish)
	if got, want := read(t, conn), `{"id":"r","status":409,"retryAfterMs":2000,"body":{"error":{"code":"LEASE_LOST"}}}`; got != want {
		t.Fatalf("the call in flight answered %s, want %s", got, want)
	}
	_, _, err = conn.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Fatalf("after the answer: %v, want a close of 1001", err)
	}
	<-closed
	if h.Open() != 0 {
		t.Fatalf("%d sockets open after Close", h.Open())
	}
}

// TestPagesOfOtherOriginsAreRefused: CheckOrigin is asked about a request with an Origin only.
func TestPagesOfOtherOriginsAreRefused(t *testing.T) {
	h, err := New(testConfig(func(http.ResponseWriter, *http.Request) {}))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, h) + "/v1/socket"
	if _, res, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {"https://elsewhere.example"}}); err == nil || res.StatusCode != http.StatusTeapot {
		t.Fatalf("a page of another origin: %v %v", err, res)
	}
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("a client without Origin: %v", err)
	}
	_ = conn.Close()
}
