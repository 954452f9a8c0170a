package lease

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The Validate methods check what every engine checks before it touches the store, so that both
// engines agree on what is invalid. They return *InvalidError.

// Validate checks the key, tab id, label and mode (see ValidateMode); it returns the mode with the
// default applied.
func (r AcquireRequest) Validate() (Mode, error) {
	if err := r.validateHolder(); err != nil {
		return "", err
	}
	return ValidateMode(r.Mode)
}

func (r AcquireRequest) validateHolder() error {
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if err := ValidateID("tabId", r.Holder.TabID); err != nil {
		return err
	}
	return ValidateLabel(r.Holder.Label)
}

// Validate checks the key, tab id and epoch.
func (r RenewRequest) Validate() error { return validateTabEpoch(r.Key, r.TabID, r.Epoch) }

// Validate checks the key, tab id and epoch: 0 with Gone, in range without.
func (r ReleaseRequest) Validate() error {
	if !r.Gone {
		return validateTabEpoch(r.Key, r.TabID, r.Epoch)
	}
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if err := ValidateID("tabId", r.TabID); err != nil {
		return err
	}
	if r.Epoch != 0 {
		return &InvalidError{Field: "epoch", Reason: "must be left out when the tab is gone: it ends the lease of the tab at any epoch"}
	}
	return nil
}

// ValidateCheck checks the arguments of Engine.Check.
func ValidateCheck(key Key, tabID string, epoch int64) error {
	return validateTabEpoch(key, tabID, epoch)
}

func validateTabEpoch(key Key, tabID string, epoch int64) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ValidateID("tabId", tabID); err != nil {
		return err
	}
	return ValidateEpoch(epoch)
}

// MaxIDLen and MaxLabelLen bound identifiers and labels.
const (
	MaxIDLen    = 128
	MaxLabelLen = 200
)

// ValidateID checks an identifier: 1–128 characters of [A-Za-z0-9._:@|-], and not "." or "..".
// Identifiers become parts of store keys, so nothing else may reach an engine.
func ValidateID(field, s string) error {
	if s == "" {
		return &InvalidError{Field: field, Reason: "must not be empty"}
	}
	if len(s) > MaxIDLen {
		return &InvalidError{Field: field, Reason: "must be at most 128 characters"}
	}
	if s == "." || s == ".." {
		return &InvalidError{Field: field, Reason: `must not be "." or ".."`}
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return &InvalidError{Field: field, Reason: "may contain only A-Z a-z 0-9 . _ : @ | -"}
		}
	}
	return nil
}

func idByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '.', '_', ':', '@', '|', '-':
		return true
	}
	return false
}

// ValidateLabel checks a tab label: valid UTF-8, at most 200 characters, all printable.
func ValidateLabel(s string) error {
	if !utf8.ValidString(s) {
		return &InvalidError{Field: "label", Reason: "must be valid UTF-8"}
	}
	if utf8.RuneCountInString(s) > MaxLabelLen {
		return &InvalidError{Field: "label", Reason: "must be at most 200 characters"}
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return &InvalidError{Field: "label", Reason: "must contain only printable characters"}
		}
	}
	return nil
}

// ValidateEpoch checks that an epoch a caller presents could have been granted.
func ValidateEpoch(epoch int64) error {
	if epoch < 1 || epoch >= MaxEpoch {
		return &InvalidError{Field: "epoch", Reason: "must be an integer in [1, 2^53)"}
	}
	return nil
}

// ValidateMode checks an acquire mode (ModeTry, ModeTakeover or ModeHandoff; every engine of this
// module implements all three) and returns it with the default applied: the empty mode is ModeTry.
// Anything else is an *InvalidError.
func ValidateMode(m Mode) (Mode, error) {
	switch m {
	case "":
		return ModeTry, nil
	case ModeTry, ModeTakeover, ModeHandoff:
		return m, nil
	}
	return "", &InvalidError{Field: "mode", Reason: `must be "try", "takeover" or "handoff"`}
}

// ValidateReason checks the reason of a revoke: not blank, valid UTF-8, at most 200 characters,
// all printable.
func ValidateReason(s string) error {
	if strings.TrimSpace(s) == "" {
		return &InvalidError{Field: "reason", Reason: "is required: say why the lease is revoked"}
	}
	err := ValidateLabel(s)
	var inv *InvalidError
	if errors.As(err, &inv) {
		return &InvalidError{Field: "reason", Reason: inv.Reason}
	}
	return err
}
