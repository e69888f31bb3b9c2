package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckStatic(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	if _, err := CheckStatic(sh); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("CheckStatic(%s) = %v, want a dynamically-linked error", sh, err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckStatic(notELF); err == nil {
		t.Error("CheckStatic accepted a script")
	}
}

func TestRefNames(t *testing.T) {
	for _, c := range []struct{ in, full, tag, short string }{
		{"ipvs-proxy:latest", "docker.io/library/ipvs-proxy:latest", "latest", "ipvs-proxy:latest"},
		{"ipvs-proxy", "docker.io/library/ipvs-proxy:latest", "latest", "ipvs-proxy:latest"},
		{"registry.example:5000/net/ipvs-proxy:v1", "registry.example:5000/net/ipvs-proxy:v1", "v1", "registry.example:5000/net/ipvs-proxy:v1"},
	} {
		full, tag, short, err := RefNames(c.in)
		if err != nil || full != c.full || tag != c.tag || short != c.short {
			t.Errorf("RefNames(%q) = %q %q %q %v, want %q %q %q", c.in, full, tag, short, err, c.full, c.tag, c.short)
		}
	}
	if _, _, _, err := RefNames("Bad Name"); err == nil {
		t.Error("RefNames accepted an invalid reference")
	}
}
