//go:build unix

package redistest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

type signal = syscall.Signal

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
	sigKill = syscall.SIGKILL
)

// signalGroup signals the process group that cmd leads (procAttr makes it a group leader).
func signalGroup(cmd *exec.Cmd, sig signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}

// spawnJob asks the spawner to start cmd.
type spawnJob struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnJobs chan spawnJob
)

// startProcess starts cmd from the spawner goroutine. A parent-death signal is sent when the
// thread that forked the child exits, not the process; the spawner's thread is locked to it and
// never exits, so the signal comes only when the test binary ends.
func startProcess(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnJobs = make(chan spawnJob)
		go func() {
			runtime.LockOSThread() // never unlocked: see above
			for job := range spawnJobs {
				job.done <- job.cmd.Start()
			}
		}()
	})
	job := spawnJob{cmd: cmd, done: make(chan error, 1)}
	spawnJobs <- job
	return <-job.done
}
