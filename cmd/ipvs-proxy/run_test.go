package main

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestCommandsTakeConfig: run, preflight and status share the options and
// --config.
func TestCommandsTakeConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		fs   *pflag.FlagSet
	}{{"run", newRunCommand().Flags()}, {"preflight", newPreflightCommand().Flags()}, {"status", newStatusCommand().Flags()}} {
		for _, f := range []string{"config", "kubeconfig", "scheduler", "sync-period", "iptables-backend"} {
			if c.fs.Lookup(f) == nil {
				t.Errorf("%s has no --%s", c.name, f)
			}
		}
	}
}

func TestSetGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got, fromEnv := setGCPercent(getenv); got != defaultGCPercent || fromEnv {
		t.Errorf("without GOGC: %d (from the environment: %v), want %d", got, fromEnv, defaultGCPercent)
	}
	if now := debug.SetGCPercent(defaultGCPercent); now != defaultGCPercent {
		t.Errorf("without GOGC the runtime's percentage is %d, want %d", now, defaultGCPercent)
	}
	// With GOGC set, the runtime applied it at start; the agent keeps
	// whatever is in force and says so.
	env["GOGC"] = "200"
	debug.SetGCPercent(200)
	if got, fromEnv := setGCPercent(getenv); got != 200 || !fromEnv {
		t.Errorf("with GOGC=200: %d (from the environment: %v), want 200 from it", got, fromEnv)
	}
	if now := debug.SetGCPercent(200); now != 200 {
		t.Errorf("with GOGC=200 the runtime's percentage is %d, want it kept", now)
	}
}

// gcPercent reads the collector's percentage without changing it.
func gcPercent() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

func TestGCDuringLists(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	listed := make(chan struct{})
	gcDuringLists(context.Background(), listed)
	if now := gcPercent(); now != listGCPercent {
		t.Errorf("before the lists are in, the percentage is %d, want %d", now, listGCPercent)
	}
	close(listed)
	for deadline := time.Now().Add(5 * time.Second); gcPercent() != defaultGCPercent; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the lists, the percentage is %d, want %d", gcPercent(), defaultGCPercent)
		}
	}
}

// TestLogStop: a signal (ctx done) logs "stopping: signalled" at once and
// the end "stopped" with its time; an end without a signal (an error)
// logs neither.
func TestLogStop(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	done := logStop(ctx, zap.New(core))
	cancel()
	waitFor(t, func() bool { return logs.FilterMessage("stopping: signalled").Len() == 1 })
	done()
	stopped := logs.FilterMessage("stopped").All()
	if len(stopped) != 1 {
		t.Fatalf("stopped logged %d times, want 1: %v", len(stopped), logs.All())
	}
	if _, ok := stopped[0].ContextMap()["took"]; !ok {
		t.Errorf("stopped without its time: %v", stopped[0].ContextMap())
	}

	core, logs = observer.New(zap.InfoLevel)
	logStop(context.Background(), zap.New(core))()
	if logs.Len() != 0 {
		t.Errorf("an end without a signal logged %v", logs.All())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not within 5 s")
		}
	}
}
