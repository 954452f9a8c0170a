//go:build unix && !linux

package redistest

import "syscall"

// parentDeathSignal reports whether children die with the test binary; without it, Shared gives
// every test a private server that t.Cleanup stops.
const parentDeathSignal = false

func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
