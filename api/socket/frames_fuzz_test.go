package socket

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// recordingConn keeps what is written on it while recording.
type recordingConn struct {
	net.Conn
	mu        sync.Mutex
	recording bool
	written   bytes.Buffer
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.recording {
		c.written.Write(p)
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// record starts recording anew.
func (c *recordingConn) record() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.written.Reset()
	c.recording = true
}

// recorded answers how many bytes were recorded, and their copy.
func (c *recordingConn) recorded() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.written.Bytes())
}

// FuzzFramesEndWhereMessagesEnd: fed what gorilla/websocket's client writes, in pieces of any
// size, frames notes where each message ends, and nowhere else: messages of any length (the three
// encodings of a frame's length), in one frame or in fragments, with pings between them.
func FuzzFramesEndWhereMessagesEnd(f *testing.F) {
	f.Add([]byte{1, 0, 5, 1, 3, 200})                          // one short message, read in pieces
	f.Add([]byte{3, 1, 2, 200, 2, 0, 1, 1, 3, 255, 255, 1, 9}) // a ping, a two-byte length, an empty message
	f.Add([]byte{2, 5, 3, 3, 7, 2, 2, 100, 255, 2})            // eight-byte lengths, fragments, pings
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, conn.UnderlyingConn())
	}))
	defer srv.Close()
	var rc *recordingConn
	// A write buffer of 128 KiB: the client sends a message that fits in it as one frame, where
	// one of 4 KiB (the default) would cut any message of 64 KiB or more into frames of 4 KiB.
	d := websocket.Dialer{WriteBufferSize: 1 << 17, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		rc = &recordingConn{Conn: c}
		return rc, nil
	}}
	client, _, err := d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		f.Fatal(err)
	}
	defer client.Close()
	var mu sync.Mutex // the client is one, and fuzzing runs inputs in parallel
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		rc.record()
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := int(data[0])
			data = data[1:]
			return b
		}
		// Messages, each: its kind (a ping before it, fragments), its length, and the length of
		// its fragments; then the sizes of the pieces the bytes are read in.
		var ends []int64
		for n := next() % 8; n > 0; n-- {
			kind := next()
			size := next() * next() // up to 65,025: lengths of one, two and eight bytes' encodings
			if kind&4 != 0 {
				size += 65536
			}
			if kind&1 != 0 {
				if err := client.WriteControl(websocket.PingMessage, []byte("p"), time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			msg := bytes.Repeat([]byte("m"), size)
			if kind&2 == 0 {
				if err := client.WriteMessage(websocket.TextMessage, msg); err != nil {
					t.Fatal(err)
				}
			} else {
				w, err := client.NextWriter(websocket.BinaryMessage)
				if err != nil {
					t.Fatal(err)
				}
				step := max(1, next()*37)
				for i := 0; i < len(msg); i += step {
					if _, err := w.Write(msg[i:min(i+step, len(msg))]); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			ends = append(ends, int64(len(rc.recorded())))
		}
		stream := rc.recorded()
		var fr frames
		for len(stream) > 0 {
			k := min(len(stream), max(1, next()*next()))
			fr.feed(stream[:k])
			stream = stream[k:]
		}
		if !slices.Equal(fr.ends, ends) {
			t.Fatalf("frames noted message ends %v, want %v", fr.ends, ends)
		}
		for range ends {
			fr.took()
		}
		if fr.buffered() {
			t.Fatalf("after every message was taken, frames says %d bytes are past the last (%d)", fr.read, fr.taken)
		}
	})
}
