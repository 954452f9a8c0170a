// Command etcdpeer puts the lease work of `tablease bench` on etcd, the peer scripts/bench
// compares tablease with: KeepAliveOnce of a granted lease (as renew) and Grant+Revoke (as
// acquire+release), from as many concurrent clients, for as long. The clients share one gRPC
// connection, which HTTP/2 multiplexes (etcd's own client does so, and it is etcd's cheapest
// shape), or, with --connection-per-client, each has one, as each client of tablease bench has
// its HTTP/1.1 connection. With --pace each client calls at that pace, as tablease bench's do with
// theirs. It prints one JSON object per work with the count of operations, errors and p50/p99;
// scripts/bench reads the processes' CPU.
// It is a module of its own so that tablease does not depend on the etcd client.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

type result struct {
	Work   string  `json:"work"`
	Ops    int64   `json:"ops"`
	Errors int64   `json:"errors"`
	PerSec float64 `json:"perSecond"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	work := flag.String("work", "keepalive", "keepalive (as renew) or grant+revoke (as acquire+release)")
	concurrency := flag.Int("concurrency", 64, "concurrent clients")
	duration := flag.Duration("duration", 10*time.Second, "how long the work runs")
	perClient := flag.Bool("connection-per-client", false, "give each client a connection of its own instead of one shared by all")
	pace := flag.Duration("pace", 0, "how often each client calls (a grant and its revoke count as one); 0: each call as soon as the last is answered")
	flag.Parse()
	if *concurrency < 1 || *duration <= 0 || *pace < 0 {
		fmt.Fprintln(os.Stderr, "etcdpeer: --concurrency and --duration must be positive, --pace not negative")
		os.Exit(2)
	}

	clis := make([]*clientv3.Client, *concurrency) // the client of each worker
	for w := range clis {
		if w > 0 && !*perClient {
			clis[w] = clis[0]
			continue
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "etcdpeer:", err)
			os.Exit(1)
		}
		defer cli.Close()
		clis[w] = cli
	}
	ctx := context.Background()

	var op func(ctx context.Context, w int) error
	switch *work {
	case "keepalive":
		ids := make([]clientv3.LeaseID, *concurrency)
		for w := range ids {
			g, err := clis[w].Grant(ctx, 60)
			if err != nil {
				fmt.Fprintln(os.Stderr, "etcdpeer: grant:", err)
				os.Exit(1)
			}
			ids[w] = g.ID
		}
		op = func(ctx context.Context, w int) error { _, err := clis[w].KeepAliveOnce(ctx, ids[w]); return err }
	case "grant+revoke":
		op = func(ctx context.Context, w int) error {
			g, err := clis[w].Grant(ctx, 60)
			if err != nil {
				return err
			}
			_, err = clis[w].Revoke(ctx, g.ID)
			return err
		}
	default:
		fmt.Fprintf(os.Stderr, "etcdpeer: unknown work %q\n", *work)
		os.Exit(2)
	}

	var ops, errs atomic.Int64
	lat := make([][]time.Duration, *concurrency)
	start := time.Now()
	end := start.Add(*duration)
	var wg sync.WaitGroup
	for w := range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// As tablease bench paces its workers: worker w's k-th call at w/concurrency of the
			// pace plus k paces from the start.
			next := start.Add(*pace * time.Duration(w) / time.Duration(*concurrency))
			for time.Now().Before(end) {
				if *pace > 0 {
					if !next.Before(end) {
						return
					}
					time.Sleep(time.Until(next))
					next = next.Add(*pace)
				}
				t := time.Now()
				if err := op(ctx, w); err != nil {
					errs.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t))
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	at := func(q float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(q*float64(len(all)-1))].Microseconds()) / 1000
	}
	name := "etcd " + *work
	if *perClient {
		name += ", connection per client"
	}
	_ = json.NewEncoder(os.Stdout).Encode(result{Work: name, Ops: ops.Load(), Errors: errs.Load(),
		PerSec: float64(ops.Load()) / elapsed.Seconds(), P50Ms: at(0.5), P99Ms: at(0.99)})
}
