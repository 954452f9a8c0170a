// Package loglimit bounds how often a log line of one kind is written: a line of a kind written
// within a window of the last one of that kind is only counted, and the next one written says how
// many were left out and when the last of them was. A flood of one line (every dial of a client
// while Redis is out of reach, every strict check shown a forged token) then leaves a line per
// window, and nothing is hidden.
package loglimit

import (
	"sync"
	"time"
)

// Limit is the last time each kind of line was written, and how many of that kind were left out
// since, the last of them when. Kinds are few (a format, a cause), so its maps stay small. It is
// safe for concurrent use.
type Limit struct {
	window time.Duration
	now    func() time.Time

	mu       sync.Mutex
	last     map[string]time.Time
	left     map[string]int
	leftLast map[string]time.Time
}

// New makes a Limit that writes a line of each kind at most once per window, on the clock now.
func New(window time.Duration, now func() time.Time) *Limit {
	return &Limit{window: window, now: now, last: map[string]time.Time{}, left: map[string]int{}, leftLast: map[string]time.Time{}}
}

// Allow reports whether a line of kind may be written now, and how many were left out before it,
// the last of them when.
func (l *Limit) Allow(kind string) (ok bool, left int, leftLast time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if last, ok := l.last[kind]; ok && now.Sub(last) < l.window {
		l.left[kind]++
		l.leftLast[kind] = now
		return false, 0, time.Time{}
	}
	left, leftLast = l.left[kind], l.leftLast[kind]
	l.last[kind], l.left[kind] = now, 0
	delete(l.leftLast, kind)
	return true, left, leftLast
}
