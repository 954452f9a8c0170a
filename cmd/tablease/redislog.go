package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
)

// redisLog carries go-redis's own log lines (a pool that cannot dial, a sentinel that does not
// answer) into the service's log, as warnings in the configured format, instead of the plain text
// go-redis writes to stderr. go-redis has one logger per process: main installs a redisLog of
// serveLog, which serve points at its logger. Tests, which run many servers in one process, leave
// go-redis's own.
type redisLog struct {
	log *atomic.Pointer[slog.Logger] // nil until a serve starts: slog's default then
}

// serveLog is the logger of the running serve.
var serveLog atomic.Pointer[slog.Logger]

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	log := r.log.Load()
	if log == nil {
		log = slog.Default()
	}
	log.WarnContext(ctx, "redis client", "detail", strings.TrimSpace(fmt.Sprintf(format, v...)))
}
