package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestAClockOffRedisIsSaidOnceAndItsEndToo: a reading past maxClockOffset, beyond the error of
// its round trip, is a warning, said again only after clockRewarn; the end of it is said once;
// the gauge holds the last reading.
func TestAClockOffRedisIsSaidOnceAndItsEndToo(t *testing.T) {
	var buf bytes.Buffer
	w := newClockWatch(slog.New(slog.NewTextHandler(&buf, nil)))
	w.observe(900*time.Millisecond, time.Millisecond)
	w.observe(-1500*time.Millisecond, 2*time.Second) // a reading that waited: passed over
	if buf.Len() != 0 {
		t.Fatalf("logged for offsets that may be within a second: %s", buf.String())
	}
	w.observe(-20*time.Second, time.Millisecond)
	w.observe(-20*time.Second, time.Millisecond)
	w.observe(3*time.Second, time.Second) // passed over: the gauge keeps -20
	var m dto.Metric
	if err := w.gauge.Write(&m); err != nil || m.GetGauge().GetValue() != -20 {
		got := m.GetGauge().GetValue()
		t.Fatalf("gauge %v, want -20", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "redis_ahead_by=-20s") {
		t.Fatalf("two readings 20 s off: %q, want one warning", lines)
	}
	w.observe(10*time.Millisecond, time.Millisecond)
	w.observe(10*time.Millisecond, time.Millisecond)
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "agree again") {
		t.Fatalf("after the clocks agree: %q, want one line more", lines)
	}
}
