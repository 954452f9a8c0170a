package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tablease/tablease/internal/loglimit"
)

// redisLog carries go-redis's own log lines (a pool that cannot dial, a sentinel that does not
// answer) into the service's log, as warnings (those of infoFormats at info) in the configured
// format, instead of the plain text
// go-redis writes to stderr. go-redis has one logger per process: main installs a redisLog of
// serveLog, which serve points at its logger. Tests, which run many servers in one process, leave
// go-redis's own.
//
// While Redis is out of reach go-redis writes the same line many times a second (every dial of
// every pool, every sentinel asked), so a line whose format was logged within the last second is
// only counted, and the next one logged says how many were left out ("repeated") and when the last
// of them was ("repeated_last": they may be of an earlier outage, or of another address).
type redisLog struct {
	log   *atomic.Pointer[slog.Logger] // nil until a serve starts: slog's default then
	limit *loglimit.Limit              // a line a second of each format
}

// serveLog is the logger of the running serve.
var serveLog atomic.Pointer[slog.Logger]

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	repeated, repeatedLast := 0, time.Time{}
	if r.limit != nil {
		ok, left, leftLast := r.limit.Allow(format)
		if !ok {
			return
		}
		repeated, repeatedLast = left, leftLast
	}
	log := r.log.Load()
	if log == nil {
		log = slog.Default()
	}
	attrs := []any{"detail", strings.TrimSpace(fmt.Sprintf(format, v...))}
	if repeated > 0 {
		attrs = append(attrs, "repeated", repeated, "repeated_last", repeatedLast)
	}
	level := slog.LevelWarn
	if slices.ContainsFunc(infoFormats, func(f string) bool { return strings.HasPrefix(format, f) }) {
		level = slog.LevelInfo
	}
	log.Log(ctx, level, "redis client", attrs...)
}

// infoFormats start the formats of go-redis's lines that tell of what the sentinels answered (the
// primary they named, another sentinel) rather than of a failure: every start on Sentinel writes
// them, so they are logged at info, the others as warnings.
var infoFormats = []string{"sentinel: new master=", "sentinel: selected addr=", "sentinel: discovered new sentinel="}
