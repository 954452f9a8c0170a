package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

func TestLimitsOrDefaultFillsInTheZeroValueAndChecksTheRest(t *testing.T) {
	if got, err := (lease.Limits{}).OrDefault(); err != nil || got != lease.DefaultLimits {
		t.Errorf("zero limits: %+v, %v; want the default limits", got, err)
	}
	own := lease.Limits{Min: time.Second, Default: 2 * time.Second, Max: 3 * time.Second, HiddenMax: 4 * time.Second}
	if got, err := own.OrDefault(); err != nil || got != own {
		t.Errorf("ordered limits: %+v, %v; want them unchanged", got, err)
	}
	unordered := lease.Limits{Min: 10 * time.Second, Default: time.Second, Max: time.Minute, HiddenMax: time.Minute}
	if _, err := unordered.OrDefault(); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("unordered limits: %v, want ErrInvalid", err)
	}
}
