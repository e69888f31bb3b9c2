package nodelock

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// holdEnv makes the test binary a process that holds the lock it names
// until killed (TestMain).
const holdEnv = "NODELOCK_TEST_HOLD"

func TestMain(m *testing.M) {
	if name := os.Getenv(holdEnv); name != "" {
		if _, err := Acquire(name, "the test's holder"); err != nil {
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
// with an error naming the lock, the holder's PID and what the holder says
// of itself; once released, the lock is taken again.
func TestSecondIsRefused(t *testing.T) {
	name := testName(t)
	who := Who("ipvs-proxy run v1", fakeEnv{"POD_NAME": "ipvs-proxy-abcde", "POD_NAMESPACE": "kube-system"}.get, 1,
		time.Date(2026, 12, 6, 18, 0, 0, 0, time.UTC))
	first, err := Acquire(name, who)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Acquire(name, "second")
	if second != nil {
		t.Fatal("a second holder got the lock")
	}
	if diff := cmp.Diff(&HeldError{Name: name, PID: os.Getpid(), Who: who}, held(t, err)); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}
	for _, want := range []string{"@" + name, fmt.Sprint(os.Getpid()), "agent",
		"(the holder: ipvs-proxy run v1, pod kube-system/ipvs-proxy-abcde, pid 1 in its PID namespace, started 2026-12-06T18:00:00Z)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(name, "again")
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

	_, err = Acquire(name, "second")
	if diff := cmp.Diff(&HeldError{Name: name, PID: cmd.Process.Pid, Who: "the test's holder"}, held(t, err)); diff != "" {
		t.Errorf("refusal while the other process holds it (-want +got):\n%s", diff)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	l, err := Acquire(name, "after")
	if err != nil {
		t.Fatalf("after the holder was killed: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// fakeEnv is an environment for Who.
type fakeEnv map[string]string

func (e fakeEnv) get(k string) string { return e[k] }

// TestWhoWithoutPod: outside a pod the description has no pod.
func TestWhoWithoutPod(t *testing.T) {
	got := Who("ipvs-proxy cleanup", fakeEnv{}.get, 4242, time.Date(2026, 12, 6, 19, 0, 0, 0, time.FixedZone("x", 3600)))
	if want := "ipvs-proxy cleanup, pid 4242 in its PID namespace, started 2026-12-06T18:00:00Z"; got != want {
		t.Errorf("Who = %q, want %q", got, want)
	}
}

// TestHolderSaysLittle: a holder's description is one printable line of
// at most maxWho bytes, whatever it was given; a holder that answers
// nothing (an older release: the name is held, nothing accepts) is named
// by its PID alone, after askTimeout.
func TestHolderSaysLittle(t *testing.T) {
	name := testName(t)
	first, err := Acquire(name, "line one\x1b[31m\nline two"+strings.Repeat("x", 1000))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(name, "second")
	if got := held(t, err).Who; got != "line one[31m" {
		t.Errorf("Who = %q, want the first line without its control character", got)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	long, err := Acquire(name, strings.Repeat("é", 300))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(name, "second")
	if got := held(t, err).Who; len(got) > maxWho || !utf8.ValidString(got) || got == "" {
		t.Errorf("Who of %d bytes (valid UTF-8: %v), want 1 to %d", len(got), utf8.ValidString(got), maxWho)
	}
	if err := long.Release(); err != nil {
		t.Fatal(err)
	}

	silent, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	began := time.Now()
	_, err = Acquire(name, "second")
	if diff := cmp.Diff(&HeldError{Name: name, PID: os.Getpid()}, held(t, err)); diff != "" {
		t.Errorf("refusal by a silent holder (-want +got):\n%s", diff)
	}
	if took := time.Since(began); took > askTimeout+time.Second {
		t.Errorf("asking a silent holder took %s", took)
	}
}
