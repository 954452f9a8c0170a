package owner_test

import (
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner"
)

func TestRoleFor(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	held := lease.Lease{Held: true, Holder: lease.Holder{TabID: "t1"}, Epoch: 7, ExpiresAt: now.Add(time.Second), Now: now}
	expired := held
	expired.ExpiresAt = now
	free := lease.Lease{Epoch: 7, Now: now}
	tests := []struct {
		name string
		l    lease.Lease
		tab  string
		want owner.Role
	}{
		{"the holder of a live lease is the owner", held, "t1", owner.RoleOwner},
		{"another tab is a viewer", held, "t2", owner.RoleViewer},
		{"a request without a tab is a viewer", held, "", owner.RoleViewer},
		{"the holder of an expired lease is a viewer", expired, "t1", owner.RoleViewer},
		{"nobody owns a free lease", free, "t1", owner.RoleViewer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := owner.RoleFor(tt.l, tt.tab); got != tt.want {
				t.Fatalf("RoleFor = %q, want %q", got, tt.want)
			}
		})
	}
	if !owner.RoleOwner.Valid() || !owner.RoleViewer.Valid() || owner.Role("admin").Valid() {
		t.Fatal("Valid is wrong")
	}
}
