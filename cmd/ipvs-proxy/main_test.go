package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"testing"
)

// TestVersionFlag: --version prints the version and revision set at build
// time and the Go release; the version command, the version alone.
func TestVersionFlag(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "v1.2.3", "0123abc"
	for args, want := range map[string]string{
		"--version": "ipvs-proxy v1.2.3 (revision 0123abc, " + runtime.Version() + ")\n",
		"version":   "v1.2.3\n",
	} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{args})
		if err := root.Execute(); err != nil {
			t.Fatalf("ipvs-proxy %s: %v", args, err)
		}
		if out.String() != want {
			t.Errorf("ipvs-proxy %s printed %q, want %q", args, out.String(), want)
		}
	}
}

// TestBuildRevision: the revision set at build time, else the one Go
// stamped (dirty or not), else "unknown".
func TestBuildRevision(t *testing.T) {
	defer func(r string) { revision = r }(revision)
	stamped := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Settings: settings}, true }
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, c := range []struct {
		name, set string
		read      func() (*debug.BuildInfo, bool)
		want      string
	}{
		{"set at build time", "0123abc", stamped(debug.BuildSetting{Key: "vcs.revision", Value: "fedcba9"}), "0123abc"},
		{"stamped", "", stamped(debug.BuildSetting{Key: "vcs.revision", Value: "fedcba9"},
			debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "fedcba9"},
		{"stamped dirty", "", stamped(debug.BuildSetting{Key: "vcs.revision", Value: "fedcba9"},
			debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "fedcba9-dirty"},
		{"not stamped", "", stamped(debug.BuildSetting{Key: "-trimpath", Value: "true"}), "unknown"},
		{"no build info", "", none, "unknown"},
	} {
		revision = c.set
		if got := buildRevision(c.read); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
