package stream

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"

	"github.com/tablease/tablease/internal/netconn"
)

// Learning that the client of a stream taken over went away, on Linux.
//
// A goroutine per stream blocked in a read of its connection (watchClient) costs the stream its
// stack and the goroutine's own record, 2.5 KiB (README, Event stream). Instead, one
// goroutine of the process waits in an epoll set of its own for any of those connections to
// become readable or hung up, and reads only the one that did: what a client sends after its
// request is dropped as watchClient drops it, and an end of file or an error tells the stream
// that its client went away. Each connection is in the set with EPOLLONESHOT, armed again after
// each read, under an id of its registration rather than its file descriptor: a closed connection
// leaves the set by itself (the kernel drops a file's entries when it is closed), and an event of
// a registration that was forgotten meanwhile names no stream. Go's own poller keeps the same
// descriptor in its set; a descriptor may be in several.

// hangupEvents are the events a connection waits for: readable (stray bytes, or an end of file),
// its peer's half-close and, always reported, errors and hang-ups.
const hangupEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// hangupWatcher is the process's set of connections watched (all Handlers share it): its epoll
// set, and the registrations in it by id (a stream keeps its own, stream.hangup).
var hangupWatcher = struct {
	once sync.Once
	epfd int
	err  error
	log  *slog.Logger // the first Handler's
	mu   sync.Mutex
	next uint64
	byID map[uint64]*hangup
}{byID: map[uint64]*hangup{}}

// hangup is one connection watched: the stream it tells, and what its client sent so far.
type hangup struct {
	raw   syscall.RawConn
	st    *stream
	stray int
}

// watchHangup has the stream st told (newsGone) once the client of conn, its connection taken
// over, goes away; forgetHangup(st.hangup) ends the watch. It falls back on a goroutine of the
// stream's own (watchClient) when conn is not a TCP connection or the epoll set cannot be had.
func watchHangup(conn net.Conn, st *stream, log *slog.Logger) {
	if !register(conn, st, log) {
		go watchClient(conn, st)
	}
}

// register puts conn in the process's set for st, and reports whether it could.
func register(conn net.Conn, st *stream, log *slog.Logger) bool {
	w := &hangupWatcher
	w.once.Do(func() {
		w.log = log
		w.epfd, w.err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if w.err == nil {
			go runHangups()
		} else {
			log.Warn("event streams: no epoll set; each idle stream keeps a goroutine", slog.String("error", w.err.Error()))
		}
	})
	tc, _ := netconn.TCP(conn)
	if w.err != nil || tc == nil {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	w.mu.Lock()
	w.next++
	id := w.next
	w.byID[id] = &hangup{raw: raw, st: st}
	w.mu.Unlock()
	if err := arm(raw, syscall.EPOLL_CTL_ADD, id); err != nil {
		forgetHangup(id)
		return false
	}
	st.hangup = id
	return true
}

// forgetHangup ends the watch of registration id, if any (0: none): its stream ended.
func forgetHangup(id uint64) {
	w := &hangupWatcher
	w.mu.Lock()
	delete(w.byID, id)
	w.mu.Unlock()
}

// arm puts the connection raw in the set (op EPOLL_CTL_ADD), or arms it again (EPOLL_CTL_MOD),
// under id. It fails once the connection is closed.
func arm(raw syscall.RawConn, op int, id uint64) error {
	ev := syscall.EpollEvent{Events: hangupEvents, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var err error
	if cerr := raw.Control(func(fd uintptr) {
		err = syscall.EpollCtl(hangupWatcher.epfd, op, int(fd), &ev)
	}); cerr != nil {
		return cerr
	}
	return err
}

// runHangups is the goroutine that waits on the set, for the life of the process. Should the wait
// fail (it cannot but through a bug here), the streams still end once a write to their client
// fails (within two keepalives of its going), as they would without this watch.
func runHangups() {
	w := &hangupWatcher
	events := make([]syscall.EpollEvent, 64)
	for {
		n, err := syscall.EpollWait(w.epfd, events, -1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			w.log.Error("event streams: waiting for clients that go away failed; streams end at their next failed write",
				slog.String("error", err.Error()))
			return
		}
		for _, ev := range events[:n] {
			readHangup(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32)
		}
	}
}

// readHangup reads the connection of registration id, which the set says is readable or hung up,
// without waiting: stray bytes are dropped (up to maxStrayBytes in all) and the connection armed
// again; an end of file, an error or too many stray bytes tell its stream that the client went
// away, as does a read of a connection the stream closed meanwhile (a told stream that ended
// ignores it).
func readHangup(id uint64) {
	w := &hangupWatcher
	w.mu.Lock()
	h := w.byID[id]
	w.mu.Unlock()
	if h == nil {
		return // forgotten: the stream ended
	}
	var (
		buf  [512]byte
		n    int
		rerr error
	)
	err := h.raw.Read(func(fd uintptr) bool {
		n, rerr = syscall.Read(int(fd), buf[:])
		return true // never wait: the set says when to read again
	})
	// Nothing to read after all, or stray bytes within the limit: wait again. An end of file
	// (n == 0), an error, a connection closed meanwhile, or too many stray bytes: gone.
	again := err == nil && (errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EINTR))
	if err == nil && rerr == nil && n > 0 {
		h.stray += n
		again = h.stray < maxStrayBytes
	}
	if again && arm(h.raw, syscall.EPOLL_CTL_MOD, id) == nil {
		return
	}
	forgetHangup(id)
	h.st.tell(newsGone)
}
