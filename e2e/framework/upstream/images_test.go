package upstream

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ocitest"
)

// run is a command the tests exec in a container of the image (`/bin/sh
// -x -c`) and what its output must contain.
type run struct{ cmd, want string }

// imageCheck is what a test image must be.
type imageCheck struct {
	file, ref       string
	entrypoint, cmd string
	// files must be in the image: a path, or "*/" and a base name
	// anywhere (libraries, whose directory is the architecture's).
	files []string
	runs  []run
}

// TestTestImages assembles the test images around a stand-in agnhost and
// the real boom-server (built from e2e/tools/k8se2e), checks their names,
// entrypoints and files, and runs, chrooted into each unpacked
// filesystem, the commands the tests exec in their pods.
func TestTestImages(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "chroot needs root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipOrFail(t, "no apt-get: Debian's packages cannot be fetched")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := t.TempDir()
	suite := Suite{Dir: filepath.Join(dir, "suite")}
	buildStandIn(ctx, t, suite.Agnhost(), "agnhost stand-in")
	cache := filepath.Join(dir, "cache")
	archives, err := EnsureTestImages(ctx, cache, suite, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EnsureTestImages(ctx, cache, suite, t.Logf)
	if err != nil || !maps.Equal(again, archives) {
		t.Fatalf("second call: %v %v, want the cached %v", again, err, archives)
	}

	// The busybox image's nc reaches a listener here by name, as the
	// Conntrack test's client reaches boom-server (by DNS there).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	heard := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			heard <- err.Error()
			return
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
			heard <- err.Error()
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		heard <- line
	}()

	checks := []imageCheck{{
		file: "agnhost.tar", ref: AgnhostImage, entrypoint: "/agnhost", cmd: "pause",
		files: []string{"agnhost", "agnhost-2", "bin/sh", "usr/bin/curl", "uploads"},
		runs: []run{
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
			// As the Services tests run it (busybox 1.35's wget
			// segfaulted here: exit status 139); GNU wget's 4 is a
			// network failure.
			{"wget -q -O - -T 1 http://127.0.0.1:1 2>&1; echo status=$?", "status=4"},
			{"test -d /uploads && echo uploads", "uploads"},
			{"id -u user-defined-in-image", "1000"},
		},
	}, {
		file: "busybox.tar", ref: BusyBoxImage, cmd: "sh",
		files: []string{"bin/busybox", "bin/sh", "bin/sleep", "bin/echo", "usr/bin/nc"},
		runs: []run{
			// The Conntrack tests' init container and client.
			{"echo Pausing start. && sleep 1", "Pausing start."},
			{fmt.Sprintf("echo hello | nc boom-server %d; echo status=$?", port), "status=0"},
			{"date >/dev/null && seq 1 2 | tail -n 1", "2"},
		},
	}, {
		file: "regression-issue-74839.tar", ref: RegressionIssue74839Image, entrypoint: "/regression-issue-74839",
		files: []string{"regression-issue-74839", "bin/sh"},
		runs: []run{
			// Without the downward API's POD_IP(S) boom-server gives up:
			// it is that program, and it runs in the image.
			{"/regression-issue-74839 2>&1; echo status=$?", "No valid IP found"},
		},
	}, {
		file: "distroless-iptables.tar", ref: DistrolessIptablesImage,
		files: []string{"bin/sh", "bin/sleep", "bin/grep", "usr/bin/which", "usr/sbin/conntrack", "usr/sbin/iptables",
			"*/libnetfilter_conntrack.so.3", "*/libmnl.so.0", "*/libnfnetlink.so.0", "*/libc.so.6"},
		runs: []run{
			{"sleep 0 && echo slept", "slept"},
			{"test -x /usr/sbin/conntrack && echo yes", "yes"},
			{"which conntrack", "/usr/sbin/conntrack"},
			// conntrack's libraries load.
			{"conntrack --version", "conntrack v1."},
			{"iptables --version", "nf_tables"},
			{"echo 'tcp 6 3597 CLOSE_WAIT src=10.0.0.1 dst=10.0.0.2 sport=1 dport=11302' | grep -m 1 'CLOSE_WAIT.*dport=11302'", "3597"},
			{"cat /etc/passwd", "root:x:0:0"},
		},
	}}
	if len(archives) != len(checks) {
		t.Errorf("archives %v, want %d", archives, len(checks))
	}
	for _, c := range checks {
		t.Run(strings.TrimSuffix(c.file, ".tar"), func(t *testing.T) {
			archive := archives[c.file]
			if archive == "" {
				t.Fatalf("no %s", c.file)
			}
			if st, err := os.Stat(archive); err == nil {
				t.Logf("%s: %s, %.1f MiB", c.ref, filepath.Base(archive), float64(st.Size())/(1<<20))
			}
			root := checkImage(t, archive, c)
			if c.file == "busybox.tar" {
				if err := os.WriteFile(filepath.Join(root, "etc/hosts"), []byte("127.0.0.1 boom-server\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range c.runs {
				cmd := exec.CommandContext(ctx, "chroot", root, "/bin/sh", "-x", "-c", r.cmd)
				cmd.Env = []string{imagePath}
				out, err := cmd.CombinedOutput()
				if err != nil || !strings.Contains(string(out), r.want) {
					t.Errorf("%s: %v\n%s\nwant %q", r.cmd, err, out, r.want)
				}
			}
			if c.file == "busybox.tar" {
				select {
				case got := <-heard:
					if got != "hello\n" {
						t.Errorf("the listener heard %q from nc, want hello", got)
					}
				case <-time.After(10 * time.Second):
					t.Error("nc did not reach the listener")
				}
			}
		})
	}
}

// checkImage opens the archive, checks its name, configuration and files,
// and returns its filesystem, unpacked.
func checkImage(t *testing.T, archive string, c imageCheck) string {
	t.Helper()
	dir := t.TempDir()
	a, err := ocitest.Open(archive, filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Desc.Annotations["io.containerd.image.name"]; got != c.ref {
		t.Errorf("image name %q, want %q", got, c.ref)
	}
	cf, err := a.Image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ep, cmd := strings.Join(cf.Config.Entrypoint, " "), strings.Join(cf.Config.Cmd, " "); ep != c.entrypoint || cmd != c.cmd {
		t.Errorf("entrypoint %q cmd %q, want %q %q", ep, cmd, c.entrypoint, c.cmd)
	}
	if len(cf.Config.Env) != 1 || cf.Config.Env[0] != imagePath {
		t.Errorf("env %q, want %s", cf.Config.Env, imagePath)
	}
	root := filepath.Join(dir, "root")
	rc := mutate.Extract(a.Image)
	err = ocitest.Untar(rc, root)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	err = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil {
			names[d.Name()] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range c.files {
		if base, ok := strings.CutPrefix(f, "*/"); ok {
			if !names[base] {
				t.Errorf("no %s in the image", base)
			}
		} else if _, err := os.Lstat(filepath.Join(root, f)); err != nil {
			t.Errorf("no %s in the image: %v", f, err)
		}
	}
	return root
}

// buildStandIn builds a static program that prints say, to bin.
func buildStandIn(ctx context.Context, t *testing.T, bin, say string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(src, []byte(fmt.Sprintf("package main\n\nfunc main() { println(%q) }\n", say)), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build stand-in: %v\n%s", err, out)
	}
}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}
