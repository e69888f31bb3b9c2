package nodelock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// holdEnv makes the test binary a process that holds the lock it names
// until killed (TestMain).
const holdEnv = "NODELOCK_TEST_HOLD"

func TestMain(m *testing.M) {
	if name := os.Getenv(holdEnv); name != "" {
		if _, err := Acquire(name); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// testName is a lock name of this test alone: abstract names are shared
// by every process of the network namespace.
func testName(t *testing.T) string {
	return fmt.Sprintf("ipvs-proxy-test-%d-%s", os.Getpid(), t.Name())
}

// held returns the *HeldError in err, or fails.
func held(t *testing.T, err error) *HeldError {
	t.Helper()
	var h *HeldError
	if !errors.As(err, &h) {
		t.Fatalf("error %v, want a *HeldError", err)
	}
	return h
}

// TestSecondIsRefused: while one holder has the lock a second is refused
// with an error naming the lock and the holder's PID; once released, the
// lock is taken again.
func TestSecondIsRefused(t *testing.T) {
	name := testName(t)
	first, err := Acquire(name)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Acquire(name)
	if second != nil {
		t.Fatal("a second holder got the lock")
	}
	if diff := cmp.Diff(&HeldError{Name: name, PID: os.Getpid()}, held(t, err)); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}
	for _, want := range []string{"@" + name, fmt.Sprint(os.Getpid()), "agent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(name)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	if err := again.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestFreedWhenHolderIsKilled: a holder that dies by SIGKILL, releasing
// nothing, leaves no stale lock.
func TestFreedWhenHolderIsKilled(t *testing.T) {
	name := testName(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		t.Fatalf("holder said %q", line)
	}

	_, err = Acquire(name)
	if diff := cmp.Diff(&HeldError{Name: name, PID: cmd.Process.Pid}, held(t, err)); diff != "" {
		t.Errorf("refusal while the other process holds it (-want +got):\n%s", diff)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	l, err := Acquire(name)
	if err != nil {
		t.Fatalf("after the holder was killed: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}
