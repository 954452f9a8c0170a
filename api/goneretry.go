package api

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tablease/tablease/internal/loglimit"
	"github.com/tablease/tablease/lease"
)

// A release with gone: true comes from a page that is going away (pagehide): when the store does
// not answer it, nobody is left to send it again. Yet the tab's last calls may still take effect
// once the store answers (a takeover answered 503 that Redis runs later, guarantee 6), and would
// leave a closed tab in control until its lease runs out, up to the longest TTL. So the server
// sends such a release again itself, behind its 503 answer, until the store answers it or that TTL
// has passed since: the release the page would have retried, had it stayed. It is idempotent, and
// a gone release run late is what guarantee 7 already allows for (the tab holds nothing after it;
// a page restored from the back/forward cache meanwhile finds its gone window as after any gone
// release).

// maxGoneRetries bounds the gone releases an instance retries at once: a store outage while a
// crowd of tabs closes costs at most this many goroutines (a few KB each); past it, a release is
// not retried and its lease runs out its TTL, as before, with a warning.
const maxGoneRetries = 4096

// goneRetryFirst and goneRetryMax are the first wait before a retry, doubled after each, and its
// bound.
const (
	goneRetryFirst = 500 * time.Millisecond
	goneRetryMax   = 8 * time.Second
)

// goneRetries sends again the gone releases the store did not answer.
type goneRetries struct {
	engine  lease.Engine
	log     *slog.Logger
	until   time.Duration // how long after the first try a release is retried: the longest TTL
	metrics *metrics

	dropped *loglimit.Limit // the warnings of releases not retried, one per 10 s

	ctx    context.Context // ended by close
	cancel context.CancelFunc
	slots  chan struct{} // one per release being retried
	mu     sync.Mutex    // orders retry's wg.Add before close's wg.Wait
	closed bool
	wg     sync.WaitGroup
}

func newGoneRetries(engine lease.Engine, limits lease.Limits, log *slog.Logger, m *metrics) *goneRetries {
	ctx, cancel := context.WithCancel(context.Background())
	return &goneRetries{engine: engine, log: log, until: limits.HiddenMax, metrics: m, ctx: ctx, cancel: cancel,
		slots: make(chan struct{}, maxGoneRetries), dropped: loglimit.New(10*time.Second, time.Now)}
}

// retry sends req again behind the answer to the request that failed with err, when that is a gone
// release the store did not answer.
func (g *goneRetries) retry(req lease.ReleaseRequest, err error) {
	if !req.Gone || !errors.Is(err, lease.ErrUnavailable) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	select {
	case g.slots <- struct{}{}:
	default:
		g.metrics.goneRetries.WithLabelValues("dropped").Inc()
		if ok, left, _ := g.dropped.Allow("dropped"); ok {
			g.log.Warn("a gone release the store did not answer is not retried: too many are being retried; its lease runs out its TTL",
				"user", req.Key.User, "session", req.Key.Session, "tab", req.TabID, "pending", maxGoneRetries, "not_logged_since", left)
		}
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() { <-g.slots }()
		g.metrics.goneRetries.WithLabelValues(g.run(req)).Inc()
	}()
}

// run retries req until the store answers it, the time is up or the server stops, and says which.
func (g *goneRetries) run(req lease.ReleaseRequest) string {
	deadline := time.Now().Add(g.until)
	wait := goneRetryFirst
	for tries := 1; ; tries++ {
		wait = min(wait, max(time.Until(deadline), 0)) // the last try at the deadline, none after
		t := time.NewTimer(wait)
		select {
		case <-g.ctx.Done():
			t.Stop()
			g.log.Warn("a gone release the store did not answer was still being retried as the server stopped; its lease runs out its TTL",
				"user", req.Key.User, "session", req.Key.Session, "tab", req.TabID, "tries", tries)
			return "stopped"
		case <-t.C:
		}
		res, err := g.engine.Release(g.ctx, req)
		switch {
		case err == nil:
			g.log.Info("a gone release the store did not answer was served on a retry",
				"user", req.Key.User, "session", req.Key.Session, "tab", req.TabID, "released", res.Released, "tries", tries+1)
			return "served"
		case !errors.Is(err, lease.ErrUnavailable):
			g.log.Warn("a gone release retried was refused", "user", req.Key.User, "session", req.Key.Session, "tab", req.TabID, "err", err)
			return "refused"
		case !time.Now().Before(deadline):
			g.log.Warn("a gone release the store did not answer was given up after the longest TTL; its lease has run out",
				"user", req.Key.User, "session", req.Key.Session, "tab", req.TabID, "tries", tries+1, "err", err)
			return "given_up"
		}
		wait = min(2*wait, goneRetryMax)
	}
}

// close ends the retries and waits for them.
func (g *goneRetries) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
}
