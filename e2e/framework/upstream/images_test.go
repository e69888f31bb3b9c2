package upstream

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ocitest"
)

// TestAgnhostImage assembles the agnhost image around a stand-in static
// binary and runs, chrooted into its unpacked filesystem, the commands the
// Services tests exec in agnhost pods.
func TestAgnhostImage(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "chroot needs root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipOrFail(t, "no apt-get: Debian's packages cannot be fetched")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"agnhost stand-in\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agnhost")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build stand-in: %v\n%s", err, out)
	}
	cache := filepath.Join(dir, "cache")
	archive, err := EnsureAgnhostImage(ctx, cache, bin, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsureAgnhostImage(ctx, cache, bin, t.Logf)
	if err != nil || again != archive {
		t.Fatalf("second call: %q %v, want the cached %q", again, err, archive)
	}

	a, err := ocitest.Open(archive, filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Desc.Annotations["io.containerd.image.name"]; got != AgnhostImage {
		t.Errorf("image name %q, want %q", got, AgnhostImage)
	}
	cf, err := a.Image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/agnhost" || strings.Join(cf.Config.Cmd, " ") != "pause" {
		t.Errorf("entrypoint %q cmd %q, want /agnhost pause", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	root := filepath.Join(dir, "root")
	rc := mutate.Extract(a.Image)
	err = ocitest.Untar(rc, root)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ cmd, want string }{
		{"/agnhost", "agnhost stand-in"},
		{"/agnhost-2", "agnhost stand-in"},
		{"curl --version", "curl 7"},
		{"readlink -f /bin/sh", "/bin/dash"},
		{"nc -h 2>&1 | head -1", "OpenBSD netcat"},
		{"ss -V", "iproute2"},
		{"ip -V", "iproute2"},
		{"nslookup -version 2>&1", "9."},
		{"for i in $(seq 1 3); do echo x$i; done | tail -n 1 | grep x3", "x3"},
		{"wget --version | head -1", "GNU Wget"},
		// As the Services tests run it (busybox 1.35's wget segfaulted
		// here: exit status 139); GNU wget's 4 is a network failure.
		{"wget -q -O - -T 1 http://127.0.0.1:1 2>&1; echo status=$?", "status=4"},
		{"test -d /uploads && echo uploads", "uploads"},
		{"id -u user-defined-in-image", "1000"},
	} {
		cmd := exec.CommandContext(ctx, "chroot", root, "/bin/sh", "-x", "-c", c.cmd)
		cmd.Env = []string{"PATH=" + strings.TrimPrefix(cf.Config.Env[0], "PATH=")}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v\n%s\nwant %q", c.cmd, err, out, c.want)
		}
	}
}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}
