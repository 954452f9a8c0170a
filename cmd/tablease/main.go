// Command tablease runs the tablease lease service and its tools.
//
//	tablease serve [--dev] [flags]   run the service (see `tablease serve --help`)
//	tablease token --sub alice ...   mint an HS256 access token from TABLEASE_JWT_HS256_SECRET
//	tablease keygen [--out file]     write a new Ed25519 lease-token signing key (PKCS#8 PEM)
//	tablease admin leases|lease|revoke|audit   call the admin API (token from TABLEASE_TOKEN)
//	tablease version                 print the version
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/loglimit"
)

func main() {
	redis.SetLogger(redisLog{log: &serveLog, limit: loglimit.New(time.Second, time.Now)})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Program{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Environ: os.Environ}.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
