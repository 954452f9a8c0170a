package chaos

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

var (
	spawnOnce sync.Once
	spawnJobs chan spawnJob
)

type spawnJob struct {
	cmd  *exec.Cmd
	done chan error
}

// start starts cmd with a parent-death signal of SIGKILL, so that a tablease process never
// outlives the test binary. The signal is sent when the thread that forked the child exits, so
// every child is forked by one goroutine locked to a thread that never exits.
func start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
