package controlplane

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// live holds every ControlPlane that Start has created and Stop has not yet
// finished, so that InterruptCleanup can stop them. It is package-level
// because a signal handler has no other way to reach control planes that
// tests anywhere in the process started with the plain function Start; it
// holds nothing else and is only touched under its mutex.
var live = struct {
	sync.Mutex
	m map[*ControlPlane]struct{}
}{m: make(map[*ControlPlane]struct{})}

func registerLive(cp *ControlPlane) {
	live.Lock()
	live.m[cp] = struct{}{}
	live.Unlock()
}

func unregisterLive(cp *ControlPlane) {
	live.Lock()
	delete(live.m, cp)
	live.Unlock()
}

// stopAll stops every live control plane, concurrently.
func stopAll() {
	live.Lock()
	cps := make([]*ControlPlane, 0, len(live.m))
	for cp := range live.m {
		cps = append(cps, cp)
	}
	live.Unlock()
	var wg sync.WaitGroup
	for _, cp := range cps {
		wg.Go(cp.Stop)
	}
	wg.Wait()
}

// InterruptCleanup makes SIGINT and SIGTERM stop every control plane of this
// process (its processes and temporary directories) before the process dies
// of the signal; a second signal while that runs exits at once. Call it from
// TestMain before m.Run, and the returned function after it:
//
//	func TestMain(m *testing.M) {
//		undo := controlplane.InterruptCleanup()
//		code := m.Run()
//		undo()
//		os.Exit(code)
//	}
//
// Without it the child processes still die with the test binary
// (Pdeathsig), but their temporary directories stay behind until the next
// Start in any process removes them.
func InterruptCleanup() (undo func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	quit := make(chan struct{})
	caught := make(chan struct{}) // closed once a signal is being handled
	go func() {
		var sig os.Signal
		select {
		case sig = <-sigs:
			close(caught)
		case <-quit:
			return
		}
		stopped := make(chan struct{})
		go func() {
			stopAll()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-sigs: // impatient: the children die with us anyway
		}
		// Die of the signal, as without a handler.
		signal.Reset(syscall.SIGINT, syscall.SIGTERM)
		_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		time.Sleep(time.Second) // the signal is on its way
		os.Exit(1)
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		select {
		case <-caught:
			// Tests fail while the handler stops their control planes;
			// let the handler end the process with the signal rather
			// than TestMain with os.Exit.
			select {}
		default:
			signal.Stop(sigs)
		}
	}
}

// Temporary directories of control planes are named dirPrefix* and hold
// ownerLockName, which their process keeps flocked (the kernel drops the
// lock when the process dies, however it dies). A directory whose lock can be
// taken belongs to a dead process: removeStaleDirs deletes it. That cleans up
// after test binaries killed by SIGKILL or a -timeout panic, which leave
// about 120 MB of etcd data each.
const (
	dirPrefix     = "ipvs-proxy-cp-"
	ownerLockName = "owner.lock"
)

// makeOwnedDir creates a temporary directory in parent and locks it.
func makeOwnedDir(parent string) (string, *os.File, error) {
	dir, err := os.MkdirTemp(parent, dirPrefix)
	if err != nil {
		return "", nil, err
	}
	// Locked before it gets the name removeStaleDirs looks for.
	tmp := filepath.Join(dir, ownerLockName+".new")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			err = os.Rename(tmp, filepath.Join(dir, ownerLockName))
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return dir, f, nil
}

// removeStaleDirs removes the directories in parent whose owner is gone and
// returns how many. Directories without a lock file yet are left alone (they
// may be being created).
func removeStaleDirs(parent string) int {
	dirs, _ := filepath.Glob(filepath.Join(parent, dirPrefix+"*"))
	n := 0
	for _, dir := range dirs {
		f, err := os.OpenFile(filepath.Join(dir, ownerLockName), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if os.RemoveAll(dir) == nil {
				n++
			}
		}
		f.Close()
	}
	return n
}
