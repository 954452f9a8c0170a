package redistest

import "syscall"

// parentDeathSignal reports whether children die with the test binary, which makes a server
// without a test to stop it (the shared one) safe to start.
const parentDeathSignal = true

func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
