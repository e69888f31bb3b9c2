package sysctls

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakeWriter records the settings read and written and fails as told.
type fakeWriter struct {
	values        map[string]string
	reads, writes []string
	failGet       error
	failEnsure    error
}

func (f *fakeWriter) Get(name string) (string, error) {
	f.reads = append(f.reads, name)
	if f.failGet != nil {
		return "", f.failGet
	}
	return f.values[name], nil
}

func (f *fakeWriter) Ensure(name, value string) (string, error) {
	if f.failEnsure != nil {
		return "", f.failEnsure
	}
	old := f.values[name]
	f.writes = append(f.writes, name+"="+value)
	f.values[name] = value
	return old, nil
}

// TestEnsureSloppyTCP: on, net.ipv4.vs.sloppy_tcp is written 1 and the
// old value logged; a failed write is an error naming the option. Off,
// nothing is written, and a 1 found there is a warning.
func TestEnsureSloppyTCP(t *testing.T) {
	for _, tc := range []struct {
		name       string
		on         bool
		was        string
		failGet    error
		failEnsure error
		wantWrites []string
		wantErr    string
		wantLog    string // a log line's message contains it ("" no line)
		wantLevel  string
	}{
		{name: "on, was 0", on: true, was: "0", wantWrites: []string{"net/ipv4/vs/sloppy_tcp=1"}, wantLog: "set sysctl for --sloppy-tcp", wantLevel: "info"},
		{name: "on, write fails", on: true, was: "0", failEnsure: errors.New("permission denied"), wantErr: "--sloppy-tcp: permission denied"},
		{name: "off, 0 left alone", was: "0"},
		{name: "off, 1 found: a warning, not undone", was: "1", wantLog: "left as it is", wantLevel: "warn"},
		{name: "off, unreadable: nothing", was: "1", failGet: errors.New("no ip_vs")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.DebugLevel)
			w := &fakeWriter{values: map[string]string{SloppyTCP.Name: tc.was}, failGet: tc.failGet, failEnsure: tc.failEnsure}
			err := EnsureSloppyTCP(zap.New(core), w, tc.on)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if !slices.Equal(w.writes, tc.wantWrites) {
				t.Errorf("writes %q, want %q", w.writes, tc.wantWrites)
			}
			entries := logs.All()
			if tc.wantLog == "" {
				if len(entries) != 0 {
					t.Errorf("logged %q, want nothing", entries[0].Message)
				}
				return
			}
			if len(entries) != 1 || !strings.Contains(entries[0].Message, tc.wantLog) || entries[0].Level.String() != tc.wantLevel {
				t.Fatalf("logs %v, want one %s line with %q", entries, tc.wantLevel, tc.wantLog)
			}
			if got := entries[0].ContextMap()["value"]; got != "1" {
				t.Errorf("logged value %v, want 1", got)
			}
		})
	}
}
