package debian

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseDepends(t *testing.T) {
	out := `qemu-system-x86
  Depends: libaio1
 |Depends: libelogind0
  Depends: libsystemd0
  Depends: <python3:any>
    python3
  PreDepends: libc6
  Recommends: ovmf
libaio1
  Depends: libc6:amd64
`
	want := map[string][]Group{
		"qemu-system-x86": {{"libaio1"}, {"libelogind0", "libsystemd0"}, {"<python3:any>", "python3"}, {"libc6"}},
		"libaio1":         {{"libc6"}},
	}
	if diff := cmp.Diff(want, parseDepends(out)); diff != "" {
		t.Errorf("parseDepends (-want +got):\n%s", diff)
	}
}

func TestParseInstalled(t *testing.T) {
	out := "libc6\tinstalled\nlibfoo\tnot-installed\nlibbar\tconfig-files\nzlib1g\tinstalled\n"
	if diff := cmp.Diff(map[string]bool{"libc6": true, "zlib1g": true}, parseInstalled(out)); diff != "" {
		t.Errorf("parseInstalled (-want +got):\n%s", diff)
	}
}

func TestClosure(t *testing.T) {
	// A small package universe: iptables needs libc6, one of two
	// netfilter libraries and a virtual package; libnftnl11 needs libmnl0.
	universe := map[string][]Group{
		"iptables":     {{"libc6"}, {"libnftnl11", "libnftnl-alt"}, {"<libxtables:any>", "libxtables12"}},
		"kmod":         {{"libc6"}, {"libkmod2"}},
		"libnftnl11":   {{"libmnl0"}},
		"libkmod2":     {{"libc6"}, {"liblzma5"}},
		"libxtables12": {{"libc6"}},
		"libmnl0":      {{"libc6"}},
		"ipxe-qemu":    {{"libc6"}},
		"qemu":         {{"libc6"}, {"ipxe-qemu", "seabios"}, {"libaio1"}},
		"seabios":      {{"libfirmware"}},
	}
	for _, tc := range []struct {
		name      string
		roots     []string
		opt       ClosureOptions
		installed map[string]bool
		want      []string
		levels    [][]string
	}{{
		name:  "self-contained",
		roots: []string{"iptables", "kmod"},
		want: []string{"iptables", "kmod", "libc6", "libkmod2", "liblzma5", "libmnl0", "libnftnl11",
			"libxtables12"},
		levels: [][]string{{"iptables", "kmod"}, {"libc6", "libnftnl11", "libxtables12", "libkmod2"},
			{"libmnl0", "liblzma5"}},
	}, {
		name:      "a self-contained closure ignores what the host has installed",
		roots:     []string{"iptables"},
		installed: map[string]bool{"libc6": true, "libmnl0": true},
		want:      []string{"iptables", "libc6", "libmnl0", "libnftnl11", "libxtables12"},
		levels:    [][]string{{"iptables"}, {"libc6", "libnftnl11", "libxtables12"}, {"libmnl0"}},
	}, {
		name:      "for the host: what is installed is left out",
		roots:     []string{"iptables"},
		opt:       ClosureOptions{ForHost: true},
		installed: map[string]bool{"libc6": true, "libmnl0": true},
		want:      []string{"iptables", "libnftnl11", "libxtables12"},
		levels:    [][]string{{"iptables"}, {"libnftnl11", "libxtables12"}},
	}, {
		name:      "an installed alternative satisfies its dependency",
		roots:     []string{"iptables"},
		opt:       ClosureOptions{ForHost: true},
		installed: map[string]bool{"libc6": true, "libnftnl-alt": true},
		want:      []string{"iptables", "libxtables12"},
		levels:    [][]string{{"iptables"}, {"libxtables12"}},
	}, {
		name:   "skipped packages and roots not followed",
		roots:  []string{"qemu", "seabios"},
		opt:    ClosureOptions{NoFollow: map[string]bool{"seabios": true}, Skip: map[string]bool{"ipxe-qemu": true}},
		want:   []string{"libaio1", "libc6", "qemu", "seabios"},
		levels: [][]string{{"qemu"}, {"libc6", "libaio1"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var levels [][]string
			depends := func(pkgs []string) (map[string][]Group, error) {
				levels = append(levels, append([]string(nil), pkgs...))
				out := map[string][]Group{}
				for _, p := range pkgs {
					out[p] = universe[p]
				}
				return out, nil
			}
			installed := func([]string) map[string]bool { return tc.installed }
			got, err := closure(tc.roots, tc.opt, depends, installed)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("closure (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.levels, levels); diff != "" {
				t.Errorf("apt-cache depends calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClosureError(t *testing.T) {
	boom := errors.New("apt-cache: no lists")
	_, err := closure([]string{"iptables"}, ClosureOptions{},
		func([]string) (map[string][]Group, error) { return nil, boom },
		func([]string) map[string]bool { return nil })
	if !errors.Is(err, boom) {
		t.Errorf("closure error = %v, want %v", err, boom)
	}
}

// buildDeb makes a .deb of pkg at version holding file with content, named
// as apt-get download names it.
func buildDeb(t *testing.T, dir, pkg, version, fileName, escaped, content string) {
	t.Helper()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	control := "Package: " + pkg + "\nVersion: " + version + "\nArchitecture: all\nMaintainer: test <t@example.invalid>\nDescription: test\n"
	if err := os.WriteFile(filepath.Join(src, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(src, fileName)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	deb := filepath.Join(dir, pkg+"_"+escaped+"_all.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", src, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v: %s", err, out)
	}
}

// TestExtract unpacks real .deb files (dpkg-deb is what the package runs
// on every host it serves) and reads their versions from the file names,
// an epoch's ':' included.
func TestExtract(t *testing.T) {
	debs, root := t.TempDir(), filepath.Join(t.TempDir(), "root")
	buildDeb(t, debs, "libfoo1", "1:2.3-4", "usr/lib/libfoo.so.1", "1%3a2.3-4", "foo")
	buildDeb(t, debs, "bar", "0.9", "usr/bin/bar", "0.9", "bar")
	versions := map[string]string{}
	if err := Extract(context.Background(), debs, root, []string{"libfoo1", "bar"}, versions); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"libfoo1": "1:2.3-4", "bar": "0.9"}, versions); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	for f, want := range map[string]string{"usr/lib/libfoo.so.1": "foo", "usr/bin/bar": "bar"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", f, b, err, want)
		}
	}
	if err := Extract(context.Background(), debs, root, []string{"missing"}, nil); err == nil {
		t.Error("Extract of a package not downloaded: no error")
	}
}
