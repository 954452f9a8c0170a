package main

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxClockOffset is how far this instance's clock may be from Redis's before the log says so. The
// lease tokens Redis dates are checked on this clock (POST …/lease/check with a token) and on the
// guards': past their leeway (5 s by default) every fresh token is refused as issued in the
// future, or expired ones accepted for longer; a second leaves room to notice before that.
const maxClockOffset = time.Second

// clockRewarn is how often a clock still off is said again.
const clockRewarn = 10 * time.Minute

// maxClockRTT bounds the round trip of a reading that is taken: a TIME that waited (Redis busy,
// the network slow) is off by up to half its round trip, and is passed over.
const maxClockRTT = 100 * time.Millisecond

// clockWatch logs and exports the offset of Redis's clock from this instance's, as the Redis
// engine measures it at the start and once a sweep period (leaseredis.Engine.ClockOffset). It is
// called from one goroutine at a time.
type clockWatch struct {
	log    *slog.Logger
	gauge  prometheus.Gauge
	off    bool      // the last reading was past maxClockOffset
	warned time.Time // when it was last said
}

func newClockWatch(log *slog.Logger) *clockWatch {
	return &clockWatch{log: log, gauge: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tablease_store_clock_offset_seconds",
		Help: "How far Redis's clock (TIME) is ahead of this instance's, negative when behind, as last read (at the start and once a sweep period).",
	})}
}

// observe takes a reading: offset, within half of rtt.
func (w *clockWatch) observe(offset, rtt time.Duration) {
	if rtt > maxClockRTT {
		return
	}
	w.gauge.Set(offset.Seconds())
	off := offset.Abs()-rtt/2 > maxClockOffset
	switch {
	case off && (!w.off || time.Since(w.warned) >= clockRewarn):
		w.warned = time.Now()
		w.log.Warn("Redis's clock and this instance's disagree: lease tokens are dated by Redis and checked on this clock and the guards', which refuse fresh tokens (or accept expired ones) once the difference passes their leeway; keep every clock in NTP sync",
			"redis_ahead_by", offset.Round(time.Millisecond).String(), "rtt", rtt.Round(time.Microsecond).String())
	case !off && w.off:
		w.log.Info("Redis's clock and this instance's agree again", "redis_ahead_by", offset.Round(time.Millisecond).String())
	}
	w.off = off
}
