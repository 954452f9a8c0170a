package loglimit

import (
	"testing"
	"time"
)

func TestALineOfAKindIsWrittenOncePerWindowWithTheCountLeftOut(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := New(time.Second, func() time.Time { return now })
	if ok, left, _ := l.Allow("a"); !ok || left != 0 {
		t.Fatalf("the first line: %v, %d left out", ok, left)
	}
	for range 3 {
		now = now.Add(100 * time.Millisecond)
		if ok, _, _ := l.Allow("a"); ok {
			t.Fatal("a line within the window was written")
		}
	}
	lastLeft := now
	if ok, _, _ := l.Allow("b"); !ok {
		t.Fatal("a line of another kind was held back")
	}
	now = now.Add(time.Second)
	if ok, left, leftLast := l.Allow("a"); !ok || left != 3 || !leftLast.Equal(lastLeft) {
		t.Fatalf("after the window: %v, %d left out, the last at %v; want 3, at %v", ok, left, leftLast, lastLeft)
	}
}
