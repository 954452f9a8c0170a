package chaos

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections to a target address. While its trouble is on, it delays every
// chunk it forwards by up to MaxDelay and resets connections at random: about one request chunk
// in ResetOneIn is dropped and its connection reset, so the command never reaches Redis. With
// ResetReplies(true), replies are dropped the same way, after Redis ran the command: the client's
// driver then sends the command again, which must not be a second effect.
// MaxDelay and ResetOneIn must be set before the proxy is used.
type Proxy struct {
	Target     string
	MaxDelay   time.Duration
	ResetOneIn int

	ln      net.Listener
	trouble atomic.Bool
	replies atomic.Bool // reset connections in the reply direction too
	resets  atomic.Int64

	mu     sync.Mutex // protects conns and closed
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Target: target, MaxDelay: 120 * time.Millisecond, ResetOneIn: 10, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Trouble turns the delays and resets on or off.
func (p *Proxy) Trouble(on bool) { p.trouble.Store(on) }

// ResetReplies lets the trouble drop replies too (see Proxy).
func (p *Proxy) ResetReplies(on bool) { p.replies.Store(on) }

// Resets counts the connections reset so far.
func (p *Proxy) Resets() int64 { return p.resets.Load() }

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case add && p.closed:
		_ = c.Close()
	case add:
		p.conns[c] = struct{}{}
	default:
		delete(p.conns, c)
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.pipe(in)
	}
}

func (p *Proxy) pipe(in net.Conn) {
	defer p.wg.Done()
	out, err := net.DialTimeout("tcp", p.Target, time.Second)
	if err != nil {
		_ = in.Close()
		return
	}
	p.track(in, true)
	p.track(out, true)
	defer func() {
		p.track(in, false)
		p.track(out, false)
	}()
	var once sync.Once
	reset := func(hard bool) {
		once.Do(func() {
			if hard {
				p.resets.Add(1)
				for _, c := range []net.Conn{in, out} {
					if tc, ok := c.(*net.TCPConn); ok {
						_ = tc.SetLinger(0) // close with RST
					}
				}
			}
			_ = in.Close()
			_ = out.Close()
		})
	}
	done := make(chan struct{}, 2)
	forward := func(dst, src net.Conn, replies bool) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if p.trouble.Load() {
					if (!replies || p.replies.Load()) && p.ResetOneIn > 0 && rand.IntN(p.ResetOneIn) == 0 {
						reset(true)
						return
					}
					if p.MaxDelay > 0 {
						time.Sleep(rand.N(p.MaxDelay)) // the latency this proxy adds
					}
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					reset(false)
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					reset(false)
				} else if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
		}
	}
	go forward(out, in, false)
	go forward(in, out, true)
	<-done
	<-done
	reset(false)
}
