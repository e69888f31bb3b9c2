package main

import (
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeBOM writes a CycloneDX BOM in JSON with these components
// (path@version each) and returns its path.
func writeBOM(t *testing.T, format string, components []string) string {
	t.Helper()
	type component struct {
		Type    string `json:"type"`
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	bom := struct {
		BOMFormat  string      `json:"bomFormat"`
		Components []component `json:"components"`
	}{BOMFormat: format, Components: []component{}}
	for _, c := range components {
		path, version, _ := strings.Cut(c, "@")
		bom.Components = append(bom.Components, component{"library", path, version})
	}
	b, err := json.Marshal(bom)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sbom.cdx.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckSBOM: an SBOM is accepted only when it lists every module of
// the binary at its version (the binary here is this test's own).
func TestCheckSBOM(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, m := range info.Deps {
		all = append(all, m.Path+"@"+m.Version)
	}
	if len(all) < 2 {
		t.Fatalf("the test binary has %d modules: %v", len(all), all)
	}
	first, _, _ := strings.Cut(all[0], "@")
	for _, tc := range []struct {
		name       string
		format     string
		components []string
		wantErr    string // "" for none
	}{
		{"every module", "CycloneDX", all, ""},
		{"and more", "CycloneDX", append([]string{"example.com/other@v1.0.0"}, all...), ""},
		{"one missing", "CycloneDX", all[1:], first + " "},
		{"another version", "CycloneDX", append([]string{first + "@v0.0.0-other"}, all[1:]...), `listed as ["v0.0.0-other"]`},
		{"not CycloneDX", "SPDX", all, "bomFormat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := checkSBOM(writeBOM(t, tc.format, tc.components), self)
			switch {
			case tc.wantErr == "" && (err != nil || n != len(all)):
				t.Errorf("checked %d modules, %v; want %d, no error", n, err, len(all))
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}

// TestAgentSBOM: the SBOM make image writes (cyclonedx-gomod, pinned in
// e2e/tools/cyclonedx-gomod, over the agent's binary) passes checkSBOM
// and lists github.com/moby/ipvs at go.mod's version.
func TestAgentSBOM(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, sbom := filepath.Join(dir, "ipvs-proxy"), filepath.Join(dir, "ipvs-proxy.cdx.json")
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = ee.Stderr
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	goCmd("build", "-trimpath", "-o", bin, "./cmd/ipvs-proxy")
	goCmd("-C", "e2e/tools/cyclonedx-gomod", "tool", "cyclonedx-gomod", "bin", "-json", "-noserial", "-notimestamp", "-output", sbom, bin)
	n, err := checkSBOM(sbom, bin)
	if err != nil {
		t.Fatal(err)
	}
	want := goCmd("list", "-m", "-f", "{{.Version}}", "github.com/moby/ipvs")
	b, err := os.ReadFile(sbom)
	if err != nil {
		t.Fatal(err)
	}
	var bom cycloneDX
	if err := json.Unmarshal(b, &bom); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range bom.Components {
		if c.Name == "github.com/moby/ipvs" {
			got = append(got, c.Version)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("the SBOM lists github.com/moby/ipvs at %v, want go.mod's %s", got, want)
	}
	t.Logf("the agent's SBOM lists its %d modules, github.com/moby/ipvs %s among them", n, want)
}
