package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// checkTimeout bounds porcupine's search on one history; histories are kept small so that it ends
// far sooner.
const checkTimeout = 30 * time.Second

// Fault injects a fault while the clients of a round run. It runs in the test's goroutine, may
// wait for the clients through r, and answers whether the store lost its data. The runner waits
// until every instance is ready again before it records the end of the fault.
type Fault func(t testing.TB, c *Cluster, r *Round) (lost bool)

// Config says what to run.
type Config struct {
	Name      string        // names the sessions and the files of illegal histories
	Targets   []string      // base URLs the clients call, chosen at random per call
	Clients   int           // tabs calling at once
	Sessions  int           // sessions per round: each is one history
	Calls     int           // calls per client per round (more while a fault lasts, up to 4 times)
	Histories int           // run rounds until this many histories were checked…
	Duration  time.Duration // …and at least this long
	Fault     Fault         // nil: no fault
	Artifacts string        // directory for illegal histories and their visualization
	// StopAtIllegal ends the run at the first round with an illegal history.
	StopAtIllegal bool
}

// Report says what a run checked and found.
type Report struct {
	Rounds, Histories, Faults int
	// Calls counts the calls made; Ops the operations checked (the calls, less those whose
	// unknown outcome could not change the state, plus the losses of the store); Unknown those
	// with an unknown outcome among them.
	Calls, Ops, Unknown int
	Illegal             []string // the files of histories porcupine found not linearizable
	Undecided           []string // the files of histories whose check did not finish within checkTimeout
	Errors              []string // answers the contract does not allow
}

// Round is one round of a run: a few fresh sessions, the clients calling them, and a fault.
type Round struct {
	calls   atomic.Int64 // calls answered so far
	unknown atomic.Int64 // of which with an unknown outcome
}

// AwaitCalls waits until n more calls were answered (unknown ones only, when unknownOnly), or max
// passed, polling. It answers whether they were.
func (r *Round) AwaitCalls(n int64, unknownOnly bool, max time.Duration) bool {
	count := &r.calls
	if unknownOnly {
		count = &r.unknown
	}
	goal := count.Load() + n
	deadline := time.Now().Add(max)
	for count.Load() < goal {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond) // polling interval
	}
	return true
}

// ArtifactsDir is $TABLEASE_ARTIFACTS, else ./artifacts/ beside the test (ignored by git).
func ArtifactsDir() string {
	if d := os.Getenv("TABLEASE_ARTIFACTS"); d != "" {
		return d
	}
	abs, err := filepath.Abs("artifacts")
	if err != nil {
		return "artifacts"
	}
	return abs
}

// Run runs rounds against c until cfg is met, checking the history of every session.
func Run(t testing.TB, c *Cluster, cfg Config) Report {
	t.Helper()
	var rep Report
	clock := NewClock()
	client := &Client{HTTP: c.HTTP, Token: c.Token}
	tabs := make([]*tab, cfg.Clients)
	for i := range tabs {
		tabs[i] = &tab{id: i, name: fmt.Sprintf("tab-%d", i), epochs: map[string]int64{}, seen: map[string][]int64{}}
	}
	runID := fmt.Sprintf("%s-%08x", cfg.Name, rand.Uint32())
	begin := time.Now()
	for round := 0; rep.Histories < cfg.Histories || time.Since(begin) < cfg.Duration; round++ {
		hs := make([]*History, cfg.Sessions)
		for i := range hs {
			hs[i] = &History{Session: fmt.Sprintf("%s-r%d-s%d", runID, round, i)}
		}
		r := &Round{}
		var faultOver atomic.Bool
		faultOver.Store(cfg.Fault == nil)
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex // protects errors
			errors []string
		)
		for _, tb := range tabs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < cfg.Calls || (!faultOver.Load() && n < 4*cfg.Calls); n++ {
					h := hs[rand.IntN(len(hs))]
					in := tb.next(h.Session)
					base := cfg.Targets[rand.IntN(len(cfg.Targets))]
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					call := clock.Now()
					out, err := client.Do(ctx, base, h.Session, in)
					ret := clock.Now()
					cancel()
					if err != nil {
						mu.Lock()
						errors = append(errors, err.Error())
						mu.Unlock()
					}
					h.Add(tb.id, in, out, call, ret)
					tb.learn(h.Session, in, out)
					if out.Unknown {
						r.unknown.Add(1)
					}
					r.calls.Add(1)
					if out.Unknown {
						// Back off as a client does after 503, so that an outage does not fill
						// the history with calls whose outcome is unknown.
						time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
					}
				}
			}()
		}
		if cfg.Fault != nil {
			total := int64(cfg.Clients * cfg.Calls)
			r.AwaitCalls(total/4+rand.Int64N(total/2+1), false, time.Minute)
			from := clock.Now()
			lost := cfg.Fault(t, c, r)
			if err := c.WaitReady(); err != nil {
				faultOver.Store(true)
				wg.Wait()
				t.Fatalf("chaos: after the fault of %s: %v", cfg.Name, err)
			}
			to := clock.Now()
			if lost {
				for _, h := range hs {
					h.Add(cfg.Clients, Input{Kind: Lost}, Output{Result: Done}, from, to)
				}
			}
			rep.Faults++
			faultOver.Store(true)
		}
		wg.Wait()
		rep.Errors = append(rep.Errors, errors...)
		rep.Rounds++
		rep.Calls += int(r.calls.Load())
		illegal := false
		for _, h := range hs {
			v, err := h.Check(checkTimeout, filepath.Join(cfg.Artifacts, runID))
			if err != nil {
				t.Fatalf("chaos: writing the history of %s: %v", h.Session, err)
			}
			rep.Histories++
			rep.Ops += v.Ops
			for _, op := range h.Operations() {
				if op.Output.(Output).Unknown {
					rep.Unknown++
				}
			}
			switch v.Result {
			case porcupine.Illegal:
				rep.Illegal = append(rep.Illegal, v.Path)
				illegal = true
			case porcupine.Unknown:
				rep.Undecided = append(rep.Undecided, v.Path)
			}
		}
		if illegal && cfg.StopAtIllegal {
			break
		}
	}
	return rep
}

// tab is one client: a tab that remembers the epoch it was granted in each session and the epochs
// it saw others hold, and calls at random.
type tab struct {
	id     int
	name   string
	epochs map[string]int64   // session → the epoch this tab was last granted
	seen   map[string][]int64 // session → epochs seen in answers
}

func (tb *tab) next(sid string) Input {
	epoch := func() int64 {
		own := tb.epochs[sid]
		seen := tb.seen[sid]
		switch {
		case own != 0 && rand.IntN(10) < 8:
			return own
		case len(seen) > 0 && rand.IntN(2) == 0:
			return seen[rand.IntN(len(seen))]
		case own != 0:
			return own + 1 // an epoch nobody was granted
		}
		return 1
	}
	switch n := rand.IntN(100); {
	case n < 25:
		return Input{Kind: Acquire, Tab: tb.name}
	case n < 32:
		return Input{Kind: Takeover, Tab: tb.name}
	case n < 35:
		return Input{Kind: NewEpoch, Tab: tb.name}
	case n < 55:
		return Input{Kind: Renew, Tab: tb.name, Epoch: epoch()}
	case n < 67:
		return Input{Kind: Release, Tab: tb.name, Epoch: epoch()}
	case n < 82:
		return Input{Kind: Check, Tab: tb.name, Epoch: epoch()}
	}
	return Input{Kind: Get, Tab: tb.name}
}

func (tb *tab) learn(sid string, in Input, out Output) {
	if out.Unknown || out.Epoch == 0 {
		return
	}
	if out.Result == Granted && out.Holder == in.Tab {
		tb.epochs[sid] = out.Epoch
		return
	}
	if len(tb.seen[sid]) < 8 {
		tb.seen[sid] = append(tb.seen[sid], out.Epoch)
	}
}
