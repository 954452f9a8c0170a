package socket

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"syscall"

	"github.com/tablease/tablease/internal/netconn"
)

// # Knowing when a socket has nothing to read
//
// An idle socket waits for its next message in a new goroutine (run, in protocol.go), whose stack
// did not grow with the calls served, and which waits on the connection itself (awaitReadable)
// rather than in a read of gorilla/websocket's: one that times out ends the socket for good. Waiting on the connection tells of the bytes the kernel holds, not of
// those gorilla/websocket read already and keeps in its buffer: a client may send its next message
// before its last one is answered, in the same packet. So the socket follows the frames of what
// gorilla reads (frames, RFC 6455 §5.2, through watchedConn): once gorilla gave the socket a whole
// message, the bytes read past the end of that message's last frame, if any, are in gorilla's
// buffer, and the socket reads its next message from there without waiting.

// frames follows the frame boundaries of the bytes a client sent on a socket, as they are read:
// where each frame that ends a data message ends. The frames themselves are gorilla/websocket's to
// check; frames only counts their lengths, which their headers give.
type frames struct {
	read    int64    // bytes read so far
	hdr     [14]byte // the header of the frame being read, as far as read (hn bytes)
	hn      int
	payload int64   // bytes of the payload of the frame being read still to come, once its header is read
	final   bool    // the frame being read ends a data message
	ends    []int64 // where the frames that end data messages end (in bytes read), of the messages not taken yet
	taken   int64   // where the last message taken ended, -1 when not known
}

// feed follows the bytes p, read after those fed before.
func (f *frames) feed(p []byte) {
	for len(p) > 0 {
		if f.payload > 0 {
			k := min(int64(len(p)), f.payload)
			f.payload -= k
			f.read += k
			p = p[k:]
			if f.payload == 0 && f.final {
				f.ends = append(f.ends, f.read)
			}
			continue
		}
		f.hdr[f.hn] = p[0]
		f.hn++
		f.read++
		p = p[1:]
		if f.hn < 2 {
			continue
		}
		size := 2
		switch f.hdr[1] & 0x7f {
		case 126:
			size += 2
		case 127:
			size += 8
		}
		if f.hdr[1]&0x80 != 0 { // masked, as every frame of a client is
			size += 4
		}
		if f.hn < size {
			continue
		}
		var n int64
		switch l := f.hdr[1] & 0x7f; l {
		case 126:
			n = int64(f.hdr[2])<<8 | int64(f.hdr[3])
		case 127:
			for _, b := range f.hdr[2:10] {
				n = n<<8 | int64(b)
			}
			n &= 1<<63 - 1 // gorilla/websocket refuses a length with the high bit set
		default:
			n = int64(l)
		}
		// FIN, and a data opcode (continuation, text, binary; control frames are 0x8 and up).
		f.final = f.hdr[0]&0x80 != 0 && f.hdr[0]&0x0f < 0x8
		f.hn, f.payload = 0, n
		if n == 0 && f.final {
			f.ends = append(f.ends, f.read)
		}
	}
}

// took notes that gorilla/websocket gave the socket the next whole message.
func (f *frames) took() {
	if len(f.ends) > 0 {
		f.taken = f.ends[0]
		f.ends = f.ends[:copy(f.ends, f.ends[1:])] // in the same array: most often one message, then none
	} else {
		f.taken = -1 // a message not followed: buffered can tell nothing
	}
}

// buffered reports whether gorilla/websocket may hold bytes read past the end of the last message
// it gave the socket: the start of what the client sent next, in its buffer.
func (f *frames) buffered() bool {
	return f.taken < 0 || f.read > f.taken
}

// watchedConn is the connection of a socket, as gorilla/websocket reads it: what it reads is fed
// to frames.
type watchedConn struct {
	net.Conn
	frames frames
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.frames.feed(p[:n])
	return n, err
}

// NetConn answers the connection c wraps, as crypto/tls.Conn's does.
func (c *watchedConn) NetConn() net.Conn { return c.Conn }

// hijacker hands gorilla/websocket the connection it takes over from net/http as a watchedConn,
// conn.
type hijacker struct {
	http.ResponseWriter
	conn *watchedConn
}

func (h *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("socket: the response cannot be taken over")
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.conn = &watchedConn{Conn: c}
	return h.conn, rw, nil
}

// rawConn answers the TCP connection under c, for awaitReadable; nil when there is none, or when
// a wrapper on it may keep bytes it read (netconn.TCP).
func rawConn(c net.Conn) syscall.RawConn {
	tc, readsAhead := netconn.TCP(c)
	if tc == nil || readsAhead {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}
