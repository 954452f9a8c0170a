package lease_test

import (
	"errors"
	"testing"

	"github.com/tablease/tablease/lease"
)

func TestValidateModeAcceptsEveryModeAndAppliesTheDefault(t *testing.T) {
	for _, tc := range []struct {
		mode lease.Mode
		want lease.Mode // "" when invalid
	}{
		{"", lease.ModeTry},
		{lease.ModeTry, lease.ModeTry},
		{lease.ModeTakeover, lease.ModeTakeover},
		{lease.ModeHandoff, lease.ModeHandoff},
		{"Handoff", ""},
		{"TRY", ""},
		{"steal", ""},
	} {
		for _, v := range []struct {
			name     string
			validate func(lease.Mode) (lease.Mode, error)
		}{
			{"ValidateMode", lease.ValidateMode},
			{"AcquireRequest.Validate", func(m lease.Mode) (lease.Mode, error) { return acquireReq(m).Validate() }},
		} {
			got, err := v.validate(tc.mode)
			var invalid *lease.InvalidError
			switch {
			case tc.want == "" && (!errors.As(err, &invalid) || invalid.Field != "mode"):
				t.Errorf("%s(%q) = %q, %v; want an *InvalidError of the mode", v.name, tc.mode, got, err)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("%s(%q) = %q, %v; want %q", v.name, tc.mode, got, err, tc.want)
			}
		}
	}
}

func TestValidateOfAHandoffChecksTheRestOfTheRequest(t *testing.T) {
	req := acquireReq(lease.ModeHandoff)
	req.Holder.TabID = "no spaces"
	if _, err := req.Validate(); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("Validate of a bad tab id = %v, want ErrInvalid", err)
	}
	req = acquireReq(lease.ModeHandoff)
	req.Holder.Label = "a\nb"
	if _, err := req.Validate(); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("Validate of a bad label = %v, want ErrInvalid", err)
	}
}

func acquireReq(m lease.Mode) lease.AcquireRequest {
	return lease.AcquireRequest{Key: lease.Key{User: "alice", Session: "doc-1"}, Holder: lease.Holder{TabID: "tab-a"}, Mode: m}
}
