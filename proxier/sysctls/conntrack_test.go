package sysctls

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

func TestConntrackSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Conntrack
		cpus int
		want []Setting
	}{
		{"kube-proxy's default, 2 CPUs: the minimum wins", DefaultConntrack, 2, []Setting{
			{conntrackMax, "131072"},
			{"net/netfilter/nf_conntrack_tcp_timeout_established", "86400"},
			{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"},
		}},
		{"kube-proxy's default, 8 CPUs", DefaultConntrack, 8, []Setting{
			{conntrackMax, "262144"},
			{"net/netfilter/nf_conntrack_tcp_timeout_established", "86400"},
			{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"},
		}},
		{"kube-proxy's default, 64 CPUs: capped at 1M", DefaultConntrack, 64, []Setting{
			{conntrackMax, "1048576"},
			{"net/netfilter/nf_conntrack_tcp_timeout_established", "86400"},
			{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"},
		}},
		{"the cap wins over the minimum", Conntrack{MaxPerCore: 1 << 30, Min: 1 << 22}, 2, []Setting{{conntrackMax, "1048576"}}},
		{"nothing set: nothing written", Conntrack{}, 4, nil},
		{"the rest", Conntrack{TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}, 4, []Setting{
			{"net/netfilter/nf_conntrack_tcp_be_liberal", "1"},
			{"net/netfilter/nf_conntrack_udp_timeout", "30"},
			{"net/netfilter/nf_conntrack_udp_timeout_stream", "120"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.c.Settings(tc.cpus)); diff != "" {
				t.Errorf("Settings(%d) (-want +got):\n%s", tc.cpus, diff)
			}
		})
	}
}

func TestConntrackValidate(t *testing.T) {
	for _, bad := range []Conntrack{{MaxPerCore: -1}, {Min: -1}, {TCPCloseWaitTimeout: 500 * time.Millisecond}, {UDPTimeout: -time.Second}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if err := DefaultConntrack.Validate(); err != nil {
		t.Errorf("the default: %v", err)
	}
}

// TestEnsureConntrack writes a /proc/sys of files: the buckets grow to a
// quarter of the table (never shrink), each setting is written, and a
// missing file (nf_conntrack not loaded) is an error naming it.
func TestEnsureConntrack(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		conntrackMax:     "65536",
		conntrackBuckets: "16384",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
	}
	for name, v := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := netlinkutil.Sysctls{Root: root}
	core, logs := observer.New(zap.WarnLevel)
	if err := ensureConntrack(zap.New(core), s, DefaultConntrack, 2); err != nil || logs.Len() != 0 {
		t.Fatalf("%v; warnings %v", err, logs.All())
	}
	want := map[string]string{
		conntrackMax:     "131072",
		conntrackBuckets: "32768",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
	}
	for name, w := range want {
		if got, err := s.Get(name); err != nil || got != w {
			t.Errorf("%s = %q, %v; want %s", name, got, err, w)
		}
	}
	// A larger hash table stays.
	if _, err := s.Ensure(conntrackBuckets, "100000"); err != nil {
		t.Fatal(err)
	}
	if err := ensureConntrack(zap.NewNop(), s, DefaultConntrack, 2); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(conntrackBuckets); got != "100000" {
		t.Errorf("buckets shrunk to %s", got)
	}
	// A sysctl the kernel lacks is a warning naming it; the others are
	// still set.
	core, logs = observer.New(zap.WarnLevel)
	if err := ensureConntrack(zap.New(core), s, Conntrack{UDPTimeout: time.Minute, TCPCloseWaitTimeout: 2 * time.Hour}, 2); err != nil {
		t.Errorf("a missing sysctl: %v; want a warning only", err)
	}
	if w := logs.All(); len(w) != 1 || !strings.Contains(fmt.Sprint(w[0].ContextMap()["name"]), "nf_conntrack_udp_timeout") {
		t.Errorf("warnings %v; want one naming nf_conntrack_udp_timeout", w)
	}
	if got, _ := s.Get("net/netfilter/nf_conntrack_tcp_timeout_close_wait"); got != "7200" {
		t.Errorf("close_wait = %s after another setting was refused; want 7200", got)
	}
	if err := ensureConntrack(zap.NewNop(), s, Conntrack{MaxPerCore: -1}, 2); err == nil {
		t.Error("an invalid configuration: no error")
	}
}
