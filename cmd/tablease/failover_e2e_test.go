package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
)

// Failover tests: two instances under load while Redis loses a primary and promotes its replica.
// What a user may see is fixed by README "Failure semantics": every answer is 200 or 503
// STORE_UNAVAILABLE, the service is back within recoveryBound of the promotion, epochs never go
// back, and the event streams carry what happens after it.

// recoveryBound is how soon after Redis finished a promotion every user must be served again.
const recoveryBound = 5 * time.Second

// failoverUsers are the users of the load: enough for every shard of a Cluster to serve some.
var failoverUsers = []string{"ada", "bob", "cyd", "dan", "eve", "fay", "gus", "hal", "ivy", "jon", "kim", "lou"}

// answer is one request of the load: when it was sent, and its status and error code.
type answer struct {
	sent   time.Time
	tab    string
	status int
	code   string
	epoch  int64
}

// call sends a JSON request with token and answers its status, error code and epoch. A transport
// error is status 0.
func call(hc *http.Client, base, token, method, path string, body any) answer {
	a := answer{sent: time.Now()}
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(method, base+path, bytes.NewReader(b))
	if err != nil {
		return a
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		a.code = err.Error()
		return a
	}
	defer resp.Body.Close()
	var out struct {
		Epoch int64 `json:"epoch"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	a.status, a.code, a.epoch = resp.StatusCode, out.Error.Code, out.Epoch
	return a
}

// failoverEnv is the environment of both instances on the Redis of url.
func failoverEnv(t *testing.T, url string) map[string]string {
	return map[string]string{
		"TABLEASE_REDIS_URL":         url,
		"TABLEASE_REDIS_TIMEOUT":     "1s",
		"TABLEASE_RATE_LIMIT":        "0",
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LOG_FORMAT":        "text",
		"TABLEASE_LOG_LEVEL":         "error",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	}
}

func tokenOf(t *testing.T, sub string) string {
	t.Helper()
	tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"},
		api.TokenSpec{Sub: sub, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// failoverStory runs the load on two instances of url, calls fail (which kills a primary and
// answers when Redis finished promoting its replica), and checks what the users saw. victim is a
// user whose leases live on the primary that fail kills.
func failoverStory(t *testing.T, url, victim string, fail func() time.Time) {
	env := failoverEnv(t, url)
	base1, _ := startServer(t, env)
	base2, _ := startServer(t, env)
	bases := []string{base1, base2}
	hc := &http.Client{Timeout: 10 * time.Second}

	// The victim's session is watched through both instances, by clients that reconnect as a
	// browser's EventSource does: a stream whose watch cannot be made again within a few seconds
	// ends (api/stream, rewatchFor), and a failover may take longer.
	vtok := tokenOf(t, victim)
	const session = "/v1/sessions/doc-1"
	streams := []*eventStream{
		followEvents(t, base1, session+"/events?tabId=watch-1", vtok),
		followEvents(t, base2, session+"/events?tabId=watch-2", vtok),
	}
	for _, s := range streams {
		s.must("snapshot", 5*time.Second)
	}

	// The load: each user takes its session over again and again, from two tabs through the two
	// instances in turn. Every grant must be 200 or 503, and epochs must only increase.
	var (
		mu      sync.Mutex
		answers = make(map[string][]answer)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for _, u := range failoverUsers {
		tok := tokenOf(t, u)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tab := fmt.Sprintf("tab-%d", i%2)
				a := call(hc, bases[i%2], tok, "POST", "/v1/sessions/load/lease",
					map[string]any{"tabId": tab, "mode": "takeover", "ttlMs": 30000})
				a.tab = tab
				mu.Lock()
				answers[u] = append(answers[u], a)
				mu.Unlock()
				// A pause between calls, longer after a 503 as a client backs off: enough load to
				// see every user's answers through the failover, little enough to leave the CPU
				// to the tests running beside this one.
				pause := 25 * time.Millisecond
				if a.status != 200 {
					pause = 50 * time.Millisecond
				}
				time.Sleep(pause)
			}
		}()
	}
	waitAnswers := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			ok := true
			for _, u := range failoverUsers {
				ok = ok && len(answers[u]) >= n
			}
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the load did not get %d answers per user within 30s", n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAnswers(5)

	promoted := fail()
	t.Logf("the promotion finished %v", promoted.Format("15:04:05.000"))
	// The load goes on until well past the bound, so that a slow recovery shows.
	for time.Now().Before(promoted.Add(recoveryBound + 2*time.Second)) {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	worst := -time.Hour
	for _, u := range failoverUsers {
		var (
			last        int64
			lastTab     string
			lastFailure time.Time
		)
		unavailable := 0
		for _, a := range answers[u] {
			switch {
			case a.status == 200:
				// The same epoch again only for the tab that holds it (a takeover by the holder).
				if a.epoch < last || (a.epoch == last && a.tab != lastTab) {
					t.Errorf("%s: epoch %d granted to %s after %d to %s: epochs went back", u, a.epoch, a.tab, last, lastTab)
				}
				last, lastTab = a.epoch, a.tab
			case a.status == 503 && a.code == "STORE_UNAVAILABLE":
				unavailable++
				lastFailure = a.sent
			default:
				t.Errorf("%s: an answer %d %q during the failover; want only 200 or 503 STORE_UNAVAILABLE", u, a.status, a.code)
				lastFailure = a.sent
			}
		}
		if d := lastFailure.Sub(promoted); d > worst {
			worst = d
		}
		if !lastFailure.IsZero() && lastFailure.After(promoted.Add(recoveryBound)) {
			t.Errorf("%s: still failing %v after the promotion (%d answers, %d unavailable); want served within %v",
				u, lastFailure.Sub(promoted).Round(time.Millisecond), len(answers[u]), unavailable, recoveryBound)
		}
		t.Logf("%s: %d answers, %d unavailable", u, len(answers[u]), unavailable)
	}
	t.Logf("the last failure came %v after the promotion (negative: before it)", worst.Round(time.Millisecond))

	// The streams carry on: a takeover through one instance reaches the stream through the other
	// within a second, and an expiry is announced without a request.
	for i, typ := range []string{"granted", "taken_over"} {
		tab := fmt.Sprintf("after-%d", i)
		a := call(hc, bases[1-i], vtok, "POST", session+"/lease", map[string]any{"tabId": tab, "mode": "takeover"})
		if a.status != 200 {
			t.Fatalf("takeover through instance %d after the failover: %d %s", 2-i, a.status, a.code)
		}
		awaitLease(t, streams[i], typ, tab, a.epoch, time.Second)
	}
	a := call(hc, base1, vtok, "POST", session+"/lease", map[string]any{"tabId": "short", "mode": "takeover", "ttlMs": 1000})
	if a.status != 200 {
		t.Fatalf("a short lease after the failover: %d %s", a.status, a.code)
	}
	for _, s := range streams {
		awaitLease(t, s, "expired", "", a.epoch, 5*time.Second)
	}
}

// awaitLease waits for the lease event of type typ with holder tab at epoch on s, skipping other
// events and snapshots; a stream that restarted after the failover starts with a snapshot, which
// is how it resumes.
func awaitLease(t *testing.T, s *eventStream, typ, tab string, epoch int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var seen []string
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatalf("no %s event at epoch %d within %v; saw %s", typ, epoch, within, strings.Join(seen, " | "))
		}
		seen = append(seen, ev.name+" "+ev.data)
		if ev.name != "lease" {
			continue
		}
		var m map[string]any
		_ = json.Unmarshal([]byte(ev.data), &m)
		if m["type"] == typ && holderOf(m) == tab && epochOf(t, m) == epoch {
			return
		}
	}
}

func TestServiceResumesWithinFiveSecondsOfAClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t)
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?cluster=true&addr=" + strings.Join(addrs[1:], "&addr=")
	victim := failoverUsers[0]
	failoverStory(t, url, victim, func() time.Time {
		primary := c.PrimaryOf(t, "tablease:{"+victim+"}:lease:doc-1")
		replica := c.ReplicaOf(t, primary)
		primary.Stop(t)
		return promotedAt(t, func() bool { return redistest.IsPrimary(replica) })
	})
}

func TestServiceResumesWithinFiveSecondsOfASentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	addrs := s.Addrs()
	url := "redis://" + addrs[0] + "?master_name=" + redistest.MasterName + "&addr=" + strings.Join(addrs[1:], "&addr=")
	failoverStory(t, url, failoverUsers[0], func() time.Time {
		s.Primary.Stop(t)
		return promotedAt(t, func() bool { return redistest.IsPrimary(s.Replica) && s.MasterAddr(t) == s.Replica.Addr() })
	})
}

// promotedAt polls done and answers when it first held: when Redis finished the promotion.
func promotedAt(t *testing.T, done func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("Redis did not promote the replica within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}
