package lease

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

// Validate checks the key, tab id and epoch.
func (r ReleaseRequest) Validate() error { return validateTabEpoch(r.Key, r.TabID, r.Epoch) }

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
