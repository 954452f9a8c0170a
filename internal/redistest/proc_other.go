//go:build !unix

package redistest

import (
	"errors"
	"os/exec"
	"syscall"
)

type signal int

const (
	sigStop signal = iota
	sigCont
	sigKill
	parentDeathSignal = false
)

var errNotUnix = errors.New("redistest runs redis-server only on Unix systems")

func procAttr() *syscall.SysProcAttr      { return nil }
func startProcess(*exec.Cmd) error        { return errNotUnix }
func signalGroup(*exec.Cmd, signal) error { return errNotUnix }
