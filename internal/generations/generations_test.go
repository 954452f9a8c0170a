package generations

import (
	"fmt"
	"testing"
)

func TestTwoGenerationsAreKeptAndAnEntryInUseSurvives(t *testing.T) {
	const per = 100
	var m Map[string, int]
	m.Put("busy", -1, per)
	for i := range 3 * per {
		m.Put(fmt.Sprint(i), i, per)
		if i%(per/2) == 0 {
			if v, ok := m.Get("busy", per); !ok || v != -1 {
				t.Fatalf("the entry in use was dropped after %d others", i)
			}
		}
		if n := m.Len(); n > 2*per {
			t.Fatalf("%d entries kept, want at most %d", n, 2*per)
		}
	}
	if _, ok := m.Get("0", per); ok {
		t.Error("an entry of three generations ago is still kept")
	}
	if v, ok := m.Get(fmt.Sprint(3*per-1), per); !ok || v != 3*per-1 {
		t.Errorf("the newest entry = %v, %v", v, ok)
	}
	m.Put("busy", -2, per) // replaces, wherever it was
	if v, _ := m.Get("busy", per); v != -2 {
		t.Errorf("busy = %d after it was replaced, want -2", v)
	}
	m.Delete("busy")
	if _, ok := m.Get("busy", per); ok {
		t.Error("a deleted entry is still kept")
	}
}
