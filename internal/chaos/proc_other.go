//go:build !linux

package chaos

import "os/exec"

// start starts cmd; the test's cleanup kills it.
func start(cmd *exec.Cmd) error { return cmd.Start() }
