package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
)

// bench drives a running tablease over HTTP and reports what its operations cost: throughput and
// latency of renew and of acquire+release, the latency from a takeover to its event on a stream
// while many idle streams are open and, when it is given the processes' PIDs (--pid) and the
// Redis URL (--redis), CPU per operation per process, RSS per idle stream and per idle lease
// socket, and Redis memory per lease. scripts/bench starts a private Redis and tablease and runs it.
func (p Program) bench(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("tablease bench", flag.ContinueOnError)
	var o benchOptions
	fs.StringVar(&o.url, "url", "http://127.0.0.1:8080", "the tablease to drive")
	fs.StringVar(&o.transport, "transport", "http", "how renew and acquire make their calls: http (a request each), or socket (one lease socket per client, GET /v1/socket)")
	work := fs.String("work", "renew,acquire,streams,memory,sockets", "what to measure, comma-separated: renew, acquire, check, streams, memory, sockets")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long renew and acquire run each")
	fs.IntVar(&o.concurrency, "concurrency", 64, "concurrent clients for renew and acquire (one user and session each)")
	fs.DurationVar(&o.pace, "pace", 0, "how often each client of renew, acquire and check calls (an acquire and its release count as one), as a tab renews; 0: each call as soon as the last is answered")
	fs.IntVar(&o.streams, "streams", 1000, "idle event streams held open while takeovers are timed")
	fs.IntVar(&o.takeovers, "takeovers", 200, "takeovers timed to their event")
	fs.IntVar(&o.idleSockets, "sockets", 1000, "idle lease sockets held open to measure the server's RSS per socket (each after one acquire)")
	fs.IntVar(&o.sessions, "sessions", 2000, "sessions acquired to measure Redis memory per lease")
	fs.IntVar(&o.sessionsPerUser, "sessions-per-user", 100, "sessions of each user in the memory work (a user's audit log and index are shared by its sessions)")
	fs.StringVar(&o.redisURL, "redis", "", "the Redis tablease uses, to read its memory (memory work) and the time its functions take per operation")
	fs.StringVar(&o.prefix, "prefix", "bench", "prefix of the users and sessions the bench creates")
	fs.StringVar(&o.memTab, "tab-id", "t", "the tab id of the memory work's leases (the browser client's are \"t-\" and 22 random characters)")
	fs.DurationVar(&o.answersKept, "answers-kept", 0, "how long the server keeps the answers of acquires and releases for their retries, which the memory work waits out (default: as a server with this environment's TABLEASE_REDIS_TIMEOUT keeps them)")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	pids := pidFlag{}
	fs.Var(&pids, "pid", "NAME=PID of a process whose CPU per operation to report (repeatable), e.g. tablease=123")
	if code, ok := p.parseFlags(fs, "tablease bench", "usage: tablease bench [flags]   (README \"Cost per operation\")", args); !ok {
		return code
	}
	o.pids = pids
	if o.answersKept == 0 {
		timeout, err := time.ParseDuration(cmp.Or(p.Getenv("TABLEASE_REDIS_TIMEOUT"), "0s"))
		if err != nil {
			fmt.Fprintln(p.Stderr, "tablease bench: TABLEASE_REDIS_TIMEOUT:", err)
			return 2
		}
		o.answersKept = leaseredis.AnswersKept(timeout)
	}
	if o.concurrency < 1 || o.streams < 0 || o.idleSockets < 0 || o.takeovers < 1 || o.sessions < 1 || o.sessionsPerUser < 1 || o.duration <= 0 || o.answersKept < 0 || o.pace < 0 {
		fmt.Fprintln(p.Stderr, "tablease bench: --concurrency, --takeovers, --sessions and --sessions-per-user must be positive, --streams, --sockets, --answers-kept and --pace not negative, --duration positive")
		return 2
	}
	if o.transport != "http" && o.transport != "socket" {
		fmt.Fprintln(p.Stderr, "tablease bench: --transport must be http or socket")
		return 2
	}
	if err := lease.ValidateID("--tab-id", o.memTab); err != nil {
		fmt.Fprintln(p.Stderr, "tablease bench:", err)
		return 2
	}
	cfg, err := benchAuth(p.Getenv)
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease bench:", err)
		return 2
	}
	o.auth = cfg
	works := splitList(*work)
	for _, w := range works {
		if !slices.Contains([]string{"renew", "acquire", "check", "streams", "sockets", "memory"}, w) {
			fmt.Fprintf(p.Stderr, "tablease bench: --work: unknown work %q\n", w)
			return 2
		}
		if w == "memory" && o.redisURL == "" {
			fmt.Fprintln(p.Stderr, "tablease bench: the memory work needs --redis")
			return 2
		}
	}
	b := &bench{benchOptions: o, progress: p.Stderr, tokens: map[string]string{}, sockets: map[string]*benchSocket{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency + 8, MaxConnsPerHost: 0}}}
	if o.redisURL != "" {
		opts, err := redis.ParseURL(o.redisURL)
		if err != nil {
			fmt.Fprintln(p.Stderr, "tablease bench: --redis:", err)
			return 2
		}
		// The bench reads counters; Redis 7.0 knows no maintenance notifications, and go-redis
		// would warn that it could not subscribe to them.
		opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		b.redis = redis.NewClient(opts)
		defer b.redis.Close()
	}
	var results []benchResult
	for _, w := range works {
		var r []benchResult
		switch w {
		case "renew", "check":
			r, err = b.held(ctx, w)
		case "acquire":
			r, err = b.acquireRelease(ctx)
		case "streams":
			r, err = b.idleStreams(ctx)
		case "sockets":
			r, err = b.idleSocketsRSS(ctx)
		case "memory":
			r, err = b.memory(ctx)
		}
		if err != nil {
			fmt.Fprintf(p.Stderr, "\ntablease bench: %s: %v\n", w, err)
			return 1
		}
		results = append(results, r...)
	}
	b.closeSockets()
	fmt.Fprintln(p.Stderr)
	if *asJSON {
		enc := json.NewEncoder(p.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return 1
		}
		return 0
	}
	printBench(p.Stdout, results)
	return 0
}

type benchOptions struct {
	url, transport                            string
	duration, pace                            time.Duration
	concurrency, streams, takeovers, sessions int
	sessionsPerUser, idleSockets              int
	answersKept                               time.Duration
	redisURL, prefix, memTab                  string
	pids                                      pidFlag
	auth                                      api.AuthConfig
}

// benchResult is one line of the summary. Zero fields are not measured.
type benchResult struct {
	Work   string `json:"work"`
	Ops    int64  `json:"ops"`
	Errors int64  `json:"errors"`
	// FirstError is what the first failed operation answered (its route, status and code).
	FirstError string             `json:"firstError,omitempty"`
	PerSecond  float64            `json:"perSecond,omitempty"`
	P50Ms      float64            `json:"p50Ms,omitempty"`
	P99Ms      float64            `json:"p99Ms,omitempty"`
	CPUMicros  map[string]float64 `json:"cpuMicrosPerOp,omitempty"` // by process name
	// FunctionMicros is the time Redis spent running tablease's functions per operation (INFO
	// commandstats of FCALL: the scripts' own cost, without reading and answering the command),
	// and FunctionCalls their number per operation; with --redis only.
	FunctionMicros float64 `json:"redisFunctionMicrosPerOp,omitempty"`
	FunctionCalls  float64 `json:"redisFunctionCallsPerOp,omitempty"`
	Note           string  `json:"note,omitempty"`
	// Bytes is a size per unit of Note ("RSS per stream", "Redis bytes per held lease"…).
	Bytes float64 `json:"bytes,omitempty"`
}

type bench struct {
	benchOptions
	progress io.Writer
	client   *http.Client
	redis    *redis.Client // the Redis of --redis; nil without

	mu      sync.Mutex
	tokens  map[string]string       // by user
	sockets map[string]*benchSocket // by user, with --transport socket
}

func (b *bench) token(sub string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.tokens[sub]; ok {
		return t, nil
	}
	t, err := api.IssueToken(b.auth, api.TokenSpec{Sub: sub, TTL: 2 * time.Hour})
	if err != nil {
		return "", err
	}
	b.tokens[sub] = t
	return t, nil
}

// leaseAnswer is what the bench reads of a lease answer or an error answer.
type leaseAnswer struct {
	Epoch int64 `json:"epoch"`
	TTLMs int64 `json:"ttlMs"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// call makes the lease call op (acquire, renew, release) of session sid as sub, and decodes the
// answer; an answer other than 200 is an error naming its code. With --transport socket, it goes
// over sub's socket.
func (b *bench) call(ctx context.Context, sub, op, sid string, body any) (leaseAnswer, error) {
	tok, err := b.token(sub)
	if err != nil {
		return leaseAnswer{}, err
	}
	data, _ := json.Marshal(body)
	if b.transport == "socket" {
		return b.callSocket(ctx, sub, tok, op, sid, data)
	}
	path := "/v1/sessions/" + sid + "/lease"
	if op != "acquire" {
		path += "/" + op
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+path, bytes.NewReader(data))
	if err != nil {
		return leaseAnswer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	res, err := b.client.Do(req)
	if err != nil {
		return leaseAnswer{}, err
	}
	defer res.Body.Close()
	var a leaseAnswer
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
		return leaseAnswer{}, fmt.Errorf("%s: status %d, answer not JSON: %w", path, res.StatusCode, err)
	}
	if res.StatusCode != http.StatusOK {
		code := "?"
		if a.Error != nil {
			code = a.Error.Code
		}
		return a, fmt.Errorf("%s: %d %s", path, res.StatusCode, code)
	}
	return a, nil
}

func (b *bench) acquire(ctx context.Context, sub, sid, tab, mode string) (int64, error) {
	a, err := b.call(ctx, sub, "acquire", sid, map[string]any{"tabId": tab, "mode": mode, "ttlMs": 60000})
	return a.Epoch, err
}

func (b *bench) release(ctx context.Context, sub, sid, tab string, epoch int64) error {
	_, err := b.call(ctx, sub, "release", sid, map[string]any{"tabId": tab, "epoch": epoch})
	return err
}

// loop runs op on every worker until the duration is over, timing each call, with a progress line:
// each call as soon as the last is answered or, with --pace, worker w's k-th call at w/concurrency
// of the pace plus k paces from the start (at once when the last was answered later), so that the
// calls of all workers spread evenly over each pace.
func (b *bench) loop(ctx context.Context, work string, op func(ctx context.Context, w int) error) (benchResult, error) {
	cpu0, err := b.cpu()
	if err != nil {
		return benchResult{}, err
	}
	fn0, err := b.functionStats(ctx)
	if err != nil {
		return benchResult{}, err
	}
	var ops, errs atomic.Int64
	var first atomic.Pointer[string]
	lat := make([][]time.Duration, b.concurrency)
	start := time.Now()
	end := start.Add(b.duration)
	var wg sync.WaitGroup
	for w := range b.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := start.Add(b.pace * time.Duration(w) / time.Duration(b.concurrency))
			// Calls in flight at the end finish: a request cut off would be a client gone, not a
			// figure of the server.
			for ctx.Err() == nil && time.Now().Before(end) {
				if b.pace > 0 {
					if !next.Before(end) || !sleepUntil(ctx, next) {
						return
					}
					next = next.Add(b.pace)
				}
				t := time.Now()
				if err := op(ctx, w); err != nil {
					errs.Add(1)
					msg := err.Error()
					first.CompareAndSwap(nil, &msg)
					continue
				}
				lat[w] = append(lat[w], time.Since(t))
				ops.Add(1)
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-tick.C:
			el := time.Since(start)
			fmt.Fprintf(b.progress, "\r%-16s %3.0fs/%.0fs  %9d ops  %8.0f/s  %d errors   ", work, el.Seconds(), b.duration.Seconds(), ops.Load(), float64(ops.Load())/el.Seconds(), errs.Load())
		}
	}
	elapsed := time.Since(start)
	cpu1, err := b.cpu()
	if err != nil {
		return benchResult{}, err
	}
	all := slices.Concat(lat...)
	r := benchResult{Work: work, Ops: ops.Load(), Errors: errs.Load(), PerSecond: float64(ops.Load()) / elapsed.Seconds()}
	if m := first.Load(); m != nil {
		r.FirstError = *m
	}
	r.P50Ms, r.P99Ms = percentiles(all)
	r.CPUMicros = perOp(cpu0, cpu1, r.Ops)
	fn1, err := b.functionStats(ctx)
	if err != nil {
		return benchResult{}, err
	}
	if r.Ops > 0 && b.redis != nil {
		r.FunctionMicros = float64(fn1.usec-fn0.usec) / float64(r.Ops)
		r.FunctionCalls = float64(fn1.calls-fn0.calls) / float64(r.Ops)
	}
	return r, nil
}

// sleepUntil waits until t, and reports whether ctx was not done by then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// functionStat is what INFO commandstats says of FCALL: calls and the µs spent in them.
type functionStat struct{ calls, usec int64 }

// functionStats reads FCALL's line of INFO commandstats from the Redis of --redis (zero without).
func (b *bench) functionStats(ctx context.Context) (functionStat, error) {
	if b.redis == nil {
		return functionStat{}, nil
	}
	info, err := b.redis.Info(ctx, "commandstats").Result()
	if err != nil {
		return functionStat{}, fmt.Errorf("INFO commandstats: %w", err)
	}
	var st functionStat
	for line := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_fcall:")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return st, nil
}

// held runs op, renew or check (as a guard does), from workers that each hold a lease of their
// own, each call as soon as the last is answered.
func (b *bench) held(ctx context.Context, op string) ([]benchResult, error) {
	sid := b.prefix + "-" + op
	epochs := make([]int64, b.concurrency)
	for w := range b.concurrency {
		e, err := b.acquire(ctx, b.user(w), sid, "t", "takeover")
		if err != nil {
			return nil, err
		}
		epochs[w] = e
	}
	r, err := b.loop(ctx, op, func(ctx context.Context, w int) error {
		_, err := b.call(ctx, b.user(w), op, sid, map[string]any{"tabId": "t", "epoch": epochs[w]})
		return err
	})
	for w := range b.concurrency {
		_ = b.release(context.WithoutCancel(ctx), b.user(w), sid, "t", epochs[w])
	}
	return []benchResult{r}, err
}

// acquireRelease: each worker acquires a free session and releases it, one operation a pair.
func (b *bench) acquireRelease(ctx context.Context) ([]benchResult, error) {
	r, err := b.loop(ctx, "acquire+release", func(ctx context.Context, w int) error {
		sid := b.prefix + "-acquire"
		e, err := b.acquire(ctx, b.user(w), sid, "t", "try")
		if err != nil {
			return err
		}
		return b.release(ctx, b.user(w), sid, "t", e)
	})
	return []benchResult{r}, err
}

func (b *bench) user(w int) string { return b.prefix + "-u" + strconv.Itoa(w) }

// streamsPerUser keeps the bench under the default TABLEASE_STREAMS_PER_USER (32).
const streamsPerUser = 16

// openStream opens the event stream of sid for tab as sub and calls onEvent with the epoch of
// every lease event (a snapshot included) until ctx ends. It returns once the snapshot arrived.
func (b *bench) openStream(ctx context.Context, sub, sid, tab string, onEvent func(epoch int64, at time.Time)) error {
	tok, err := b.token(sub)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/v1/sessions/"+sid+"/events?presence=false&tabId="+tab, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := b.client.Do(req)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return fmt.Errorf("stream of %s/%s: status %d", sub, sid, res.StatusCode)
	}
	first := make(chan struct{})
	go func() {
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			at := time.Now()
			var ev struct {
				Epoch int64 `json:"epoch"`
			}
			if json.Unmarshal([]byte(data), &ev) == nil && onEvent != nil {
				onEvent(ev.Epoch, at)
			}
			once.Do(func() { close(first) })
		}
		once.Do(func() { close(first) })
	}()
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// idleStreams opens the idle streams (RSS per stream), then times takeovers to their event on a
// watching stream.
func (b *bench) idleStreams(ctx context.Context) ([]benchResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closes every stream
	rss0, rssErr := b.rss("tablease")
	for i := range b.streams {
		sub := b.prefix + "-s" + strconv.Itoa(i/streamsPerUser)
		if err := b.openStream(ctx, sub, b.prefix+"-idle-"+strconv.Itoa(i), "t", nil); err != nil {
			return nil, fmt.Errorf("opening idle stream %d: %w", i+1, err)
		}
		if (i+1)%500 == 0 || i+1 == b.streams {
			fmt.Fprintf(b.progress, "\r%-16s %d/%d open   ", "idle streams", i+1, b.streams)
		}
	}
	var results []benchResult
	if rss1, err := b.rss("tablease"); err == nil && rssErr == nil && b.streams > 0 {
		r := benchResult{Work: "idle streams", Ops: int64(b.streams), Note: "tablease RSS per idle stream", Bytes: float64(rss1-rss0) / float64(b.streams)}
		if b.streams < minRSSCount {
			// The heap's own ups and downs, hundreds of KB, would be most of the figure.
			r.Note, r.Bytes = fmt.Sprintf("tablease RSS per idle stream: not measured below %d streams", minRSSCount), 0
		}
		results = append(results, r)
	}

	// The watched session: a stream of tab "w", and takeovers alternating between tabs a and b.
	sub, sid := b.prefix+"-watcher", b.prefix+"-watched"
	var mu sync.Mutex
	arrived := map[int64]time.Time{}
	cond := sync.NewCond(&mu)
	if err := b.openStream(ctx, sub, sid, "w", func(epoch int64, at time.Time) {
		mu.Lock()
		if _, ok := arrived[epoch]; !ok {
			arrived[epoch] = at
		}
		cond.Broadcast()
		mu.Unlock()
	}); err != nil {
		return nil, err
	}
	cpu0, err := b.cpu()
	if err != nil {
		return nil, err
	}
	lat := make([]time.Duration, 0, b.takeovers)
	var errs int64
	for i := range b.takeovers {
		tab := []string{"a", "b"}[i%2]
		sent := time.Now()
		epoch, err := b.acquire(ctx, sub, sid, tab, "takeover")
		if err != nil {
			errs++
			continue
		}
		deadline := time.AfterFunc(5*time.Second, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
		mu.Lock()
		at, ok := arrived[epoch]
		for !ok && time.Since(sent) < 5*time.Second {
			cond.Wait()
			at, ok = arrived[epoch]
		}
		mu.Unlock()
		deadline.Stop()
		if !ok {
			errs++
			continue
		}
		lat = append(lat, at.Sub(sent))
		if (i+1)%50 == 0 {
			fmt.Fprintf(b.progress, "\r%-16s %d/%d   ", "takeover→event", i+1, b.takeovers)
		}
	}
	cpu1, err := b.cpu()
	if err != nil {
		return nil, err
	}
	r := benchResult{Work: "takeover→event", Ops: int64(len(lat)), Errors: errs, Note: fmt.Sprintf("with %d idle streams open", b.streams)}
	r.P50Ms, r.P99Ms = percentiles(lat)
	r.CPUMicros = perOp(cpu0, cpu1, r.Ops)
	return append(results, r), nil
}

// minRSSCount is the fewest idle streams or sockets over which the bench reports RSS per each:
// over 100 streams, it printed from -24,781 to 31,580 B per stream where 1,000 give 2.7-3.2 KB.
const minRSSCount = 1000

// memory acquires sessions and reads Redis's used_memory before, while they are held, and after
// they are released, both with and without the answers kept for the retries of the releases,
// less the memory of the clients' connections (the bench's load opens connections that the
// sessions do not keep) and of the script cache (loaded by the first calls), neither of which
// grows with the sessions. It waits out first the answers kept for the retries of the calls made
// before it, by this bench or an earlier one (scripts/bench runs the loads in runs of their own).
func (b *bench) memory(ctx context.Context) ([]benchResult, error) {
	// A connection of its own, opened now: the readings subtract the clients' buffers, and those
	// of the connection that read commandstats through the loads before vary by kilobytes.
	rdb := redis.NewClient(b.redis.Options())
	defer rdb.Close()
	used := func() (int64, error) {
		info, err := rdb.InfoMap(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		var n int64
		for _, f := range []string{"used_memory", "mem_clients_normal", "used_memory_scripts"} {
			v, err := strconv.ParseInt(info["Memory"][f], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO memory %s: %w", f, err)
			}
			if f != "used_memory" {
				v = -v
			}
			n += v
		}
		return n, nil
	}
	// settled waits until the answers kept for retries of the calls made so far expired, and
	// Redis reclaimed them: --answers-kept, then until the number of keys holds for three
	// readings. The readings then count what stays.
	settled := func(label string) error {
		fmt.Fprintf(b.progress, "\r%-16s waiting %v for the answers kept for retries to expire   ", label, b.answersKept)
		last, same := int64(-1), 0
		for wait := b.answersKept; same < 3; wait = 200 * time.Millisecond {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
			n, err := rdb.DBSize(ctx).Result()
			if err != nil {
				return err
			}
			if n == last {
				same++
			} else {
				last, same = n, 0
			}
		}
		return nil
	}
	if err := settled("memory"); err != nil { // the answers of the calls before would expire while it reads
		return nil, err
	}
	m0, err := used()
	if err != nil {
		return nil, err
	}
	epochs := make([]int64, b.sessions)
	if err := b.each(ctx, b.sessions, "memory: acquire", func(ctx context.Context, i int) (err error) {
		epochs[i], err = b.acquire(ctx, b.memUser(i), b.prefix+"-mem-"+strconv.Itoa(i), b.memTab, "try")
		return err
	}); err != nil {
		return nil, err
	}
	if err := settled("memory: held"); err != nil {
		return nil, err
	}
	m1, err := used()
	if err != nil {
		return nil, err
	}
	if err := b.each(ctx, b.sessions, "memory: release", func(ctx context.Context, i int) error {
		return b.release(ctx, b.memUser(i), b.prefix+"-mem-"+strconv.Itoa(i), b.memTab, epochs[i])
	}); err != nil {
		return nil, err
	}
	m2, err := used()
	if err != nil {
		return nil, err
	}
	if err := settled("memory: free"); err != nil {
		return nil, err
	}
	m3, err := used()
	if err != nil {
		return nil, err
	}
	n := float64(b.sessions)
	return []benchResult{
		{Work: "redis memory", Ops: int64(b.sessions), Note: "Redis bytes per held lease (no stream watching it)", Bytes: float64(m1-m0) / n},
		{Work: "redis memory", Ops: int64(b.sessions), Note: "Redis bytes per free session, with its release's answer kept for retries", Bytes: float64(m2-m0) / n},
		{Work: "redis memory", Ops: int64(b.sessions), Note: "Redis bytes per free session, once that answer expired", Bytes: float64(m3-m0) / n},
	}, nil
}

func (b *bench) memUser(i int) string { return b.prefix + "-m" + strconv.Itoa(i/b.sessionsPerUser) }

// each runs op for 0..n-1 on the bench's workers, stopping at the first error.
func (b *bench) each(ctx context.Context, n int, label string, op func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range b.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fmt.Fprintf(b.progress, "\r%-16s %d done   ", label, n)
	return context.Cause(ctx)
}

// cpu reads the CPU time used so far by every --pid process.
func (b *bench) cpu() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for name, pid := range b.pids {
		d, err := processCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("--pid %s=%d: %w", name, pid, err)
		}
		out[name] = d
	}
	return out, nil
}

func (b *bench) rss(name string) (int64, error) {
	pid, ok := b.pids[name]
	if !ok {
		return 0, fmt.Errorf("no --pid %s", name)
	}
	return processRSS(pid)
}

func perOp(before, after map[string]time.Duration, ops int64) map[string]float64 {
	if len(before) == 0 || ops == 0 {
		return nil
	}
	out := map[string]float64{}
	for name, d := range after {
		out[name] = float64((d - before[name]).Microseconds()) / float64(ops)
	}
	return out
}

// percentiles are the p50 and p99 of d in milliseconds.
func percentiles(d []time.Duration) (p50, p99 float64) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	at := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000 }
	return at(0.50), at(0.99)
}

func printBench(w io.Writer, results []benchResult) {
	names := map[string]bool{}
	for _, r := range results {
		for n := range r.CPUMicros {
			names[n] = true
		}
	}
	procs := make([]string, 0, len(names))
	for n := range names {
		procs = append(procs, n)
	}
	slices.Sort(procs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "work\tops\terrors\tops/s\tp50 ms\tp99 ms\t")
	for _, n := range procs {
		fmt.Fprintf(tw, "%s CPU µs/op\t", n)
	}
	fmt.Fprintln(tw, "in functions µs/op\tsize\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t", r.Work, r.Ops, r.Errors, figure(r.PerSecond, "%.0f"), figure(r.P50Ms, "%.2f"), figure(r.P99Ms, "%.2f"))
		for _, n := range procs {
			fmt.Fprintf(tw, "%s\t", figure(r.CPUMicros[n], "%.1f"))
		}
		fn := "-"
		if r.FunctionCalls > 0 {
			fn = fmt.Sprintf("%.1f (%.1f calls)", r.FunctionMicros, r.FunctionCalls)
		}
		fmt.Fprintf(tw, "%s\t", fn)
		size := ""
		if r.Bytes != 0 {
			size = fmt.Sprintf("%.0f B %s", r.Bytes, r.Note)
		} else if r.Note != "" {
			size = r.Note
		}
		fmt.Fprintf(tw, "%s\t\n", size)
	}
	tw.Flush()
	for _, r := range results {
		if r.FirstError == "" {
			continue
		}
		fmt.Fprintf(w, "%s: %d errors, the first: %s", r.Work, r.Errors, r.FirstError)
		if strings.Contains(r.FirstError, "RATE_LIMITED") {
			fmt.Fprint(w, " (the server's rate limit refuses the bench's pace: run it with TABLEASE_RATE_LIMIT=0)")
		}
		fmt.Fprintln(w)
	}
}

func figure(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// pidFlag is the repeatable --pid NAME=PID.
type pidFlag map[string]int

func (f pidFlag) String() string { return fmt.Sprint(map[string]int(f)) }

func (f pidFlag) Set(v string) error {
	name, pid, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(pid)
	if !ok || name == "" || err != nil || n <= 0 {
		return errors.New("want NAME=PID, e.g. tablease=1234")
	}
	f[name] = n
	return nil
}

// processCPU is the user+system CPU time of process pid, from /proc/PID/stat (Linux).
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces: fields count after it.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, errors.New("unexpected /proc stat format")
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc times: 100 on every Linux architecture Go runs on.
const clockTicks = 100

// processRSS is the resident set size of process pid in bytes, from /proc/PID/status (Linux).
func processRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// benchAuth is what the bench needs to mint access tokens for the server it drives: the server's
// own TABLEASE_JWT_HS256_SECRET, TABLEASE_JWT_ISSUER and TABLEASE_JWT_AUDIENCE.
func benchAuth(getenv func(string) string) (api.AuthConfig, error) {
	cfg := api.AuthConfig{HS256Secret: []byte(getenv("TABLEASE_JWT_HS256_SECRET")), Issuer: getenv("TABLEASE_JWT_ISSUER"), Audience: getenv("TABLEASE_JWT_AUDIENCE")}
	if len(cfg.HS256Secret) < api.MinHS256SecretLen || cfg.Issuer == "" || cfg.Audience == "" {
		return api.AuthConfig{}, errors.New("set TABLEASE_JWT_HS256_SECRET, TABLEASE_JWT_ISSUER and TABLEASE_JWT_AUDIENCE to the server's")
	}
	return cfg, nil
}
