package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigConvert: `config convert --config FILE` prints the flat file
// as an IPVSProxyConfiguration; without --config, or given a file that is
// not flat, it fails.
func TestConfigConvert(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("scheduler: wrr\nsyncPeriod: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	convert := func(args ...string) (string, error) {
		root := newConfigCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"convert"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	got, err := convert("--config", path)
	if err != nil {
		t.Fatal(err)
	}
	want := "apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nipvs:\n  scheduler: wrr\n  syncPeriod: 1m0s\n"
	if got != want {
		t.Errorf("printed\n%s\nwant\n%s", got, want)
	}
	if _, err := convert(); err == nil || !strings.Contains(err.Error(), `"config" not set`) {
		t.Errorf("without --config: %v", err)
	}
	if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := convert("--config", path); err == nil || !strings.Contains(err.Error(), "nothing to convert") {
		t.Errorf("an IPVSProxyConfiguration: %v", err)
	}
}
