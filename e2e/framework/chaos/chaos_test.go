package chaos

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestWriteReadTable(t *testing.T) {
	dir := t.TempDir()
	rows := []Row{
		{Case: "restart-sigterm", TrafficAttempted: 1200, KernelWrites: 0, ConvergeSeconds: 3.25, AgentPeakMiB: 87.4, Notes: "writes 0 | held 3"},
		{Case: "apiserver-down", TrafficAttempted: 900, TrafficFailed: 1, Leaks: 2, Notes: "line\nbreak"},
	}
	for _, r := range rows {
		if err := Write(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	// A case written again replaces its row.
	rows[0].KernelWrites = 7
	if err := Write(dir, rows[0]); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{rows[1], rows[0]} // sorted by case
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, "apiserver-down.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"case"`, `"traffic_attempted"`, `"traffic_failed"`, `"kernel_writes"`, `"converge_seconds"`, `"leaks"`, `"notes"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("row file lacks %s:\n%s", k, b)
		}
	}
	table := Table(got)
	wantTable := "| case | traffic attempted | traffic failed | kernel writes | converge (s) | leaks | agent peak RSS (MiB) | notes |\n" +
		"|---|---:|---:|---:|---:|---:|---:|---|\n" +
		"| apiserver-down | 900 | 1 | 0 | 0.0 | 2 | - | line break |\n" +
		"| restart-sigterm | 1200 | 0 | 7 | 3.2 | 0 | 87 | writes 0 \\| held 3 |\n"
	if table != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", table, wantTable)
	}
	if err := Write(dir, Row{Case: "../escape"}); err == nil {
		t.Error("a case name with a path was accepted")
	}
}

func TestDirDefault(t *testing.T) {
	t.Setenv(DirEnv, "")
	d := Dir()
	if filepath.Base(d) != "chaos" || filepath.Base(filepath.Dir(d)) != "bin" {
		t.Fatalf("Dir() = %s", d)
	}
	// The repository's root, where the Makefile is (e2e/ has a go.mod too).
	if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(d)), "Makefile")); err != nil {
		t.Errorf("Dir() = %s is not under the repository's root: %v", d, err)
	}
	t.Setenv(DirEnv, "/tmp/x")
	if Dir() != "/tmp/x" {
		t.Errorf("Dir() = %s with %s=/tmp/x", Dir(), DirEnv)
	}
}

const ipvsadmOut = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.0.2.15:30080 rr
  -> 10.100.1.2:8080              Masq    1      0          0
TCP  10.96.0.10:80 rr
  -> 10.100.2.2:8080              Masq    1      0          0
  -> 10.100.1.2:8080              Masq    1      3          0
TCP  192.0.2.50:80 wlc
FWM  7 rr
  -> 10.1.1.1:80                  Masq    1      0          0
UDP  [fd00:10:96::a]:53 rr
  -> [fd00:101::2]:8080           Masq    1      0          0
TCP  10.96.0.99:80 rr
`

func TestParse(t *testing.T) {
	got := ParseIPVS(ipvsadmOut)
	want := map[string][]string{
		"TCP 10.0.2.15:30080":    {"10.100.1.2:8080"},
		"TCP 10.96.0.10:80":      {"10.100.1.2:8080", "10.100.2.2:8080"},
		"TCP 192.0.2.50:80":      {},
		"UDP [fd00:10:96::a]:53": {"[fd00:101::2]:8080"},
		"TCP 10.96.0.99:80":      {},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseIPVS = %v, want %v", got, want)
	}
	addrs := ParseAddrs("5: ipvs-proxy0    inet 10.96.0.10/32 scope global ipvs-proxy0\\       valid_lft forever preferred_lft forever\n" +
		"5: ipvs-proxy0    inet6 fd00:10:96::a/128 scope global \\       valid_lft forever preferred_lft forever\n" +
		"5: ipvs-proxy0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever\n")
	if !reflect.DeepEqual(addrs, []string{"10.96.0.10", "fd00:10:96::a"}) {
		t.Errorf("ParseAddrs = %v", addrs)
	}
	sets := ParseIPSets("create IPVSP-SERVICE hash:ip,port family inet hashsize 1024 maxelem 65536\n" +
		"add IPVSP-SERVICE 10.96.0.10,tcp:80\ncreate IPVSP-VIP hash:ip family inet\ncreate FOREIGN hash:ip\nadd FOREIGN 192.0.2.7\n")
	if !reflect.DeepEqual(sets, map[string][]string{"IPVSP-SERVICE": {"10.96.0.10,tcp:80"}, "IPVSP-VIP": {}}) {
		t.Errorf("ParseIPSets = %v", sets)
	}
	routes := ParseRoutes("local 10.96.0.0/16 proto 120 scope host \nlocal 10.251.0.10 proto kernel scope host src 10.251.0.10 \n")
	if !reflect.DeepEqual(routes, []string{"10.96.0.0/16"}) {
		t.Errorf("ParseRoutes = %v", routes)
	}
}

// TestCompareRouted: with the Service range routed, a clusterIP is held
// by the route and must not be bound; the route must be there, and no
// other, with its anchor bound.
func TestCompareRouted(t *testing.T) {
	exp := Expected{
		Virtual:       map[string][]string{"TCP 10.96.0.10:80": {"10.100.1.2:8080"}},
		Addrs:         map[string]bool{"10.96.0.10": true, "10.251.0.10": true},
		ServiceCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Routed:        []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		NodePortRange: [2]int{30000, 32767},
	}
	k := State{
		Virtual: map[string][]string{"TCP 10.96.0.10:80": {"10.100.1.2:8080"}},
		Addrs:   []string{"10.251.0.10", "10.96.0.0"},
		Routes:  []string{"10.96.0.0/16"},
		Sets:    map[string][]string{"IPVSP-VIP": {"10.96.0.10", "10.251.0.10"}, "IPVSP-SERVICE": {"10.96.0.10,tcp:80"}},
	}
	if d := Compare(k, exp); !d.Converged() {
		t.Fatalf("Compare = %s, want converged", d)
	}
	k.Addrs = []string{"10.251.0.10", "10.96.0.10"}
	k.Routes = []string{"10.97.0.0/16"}
	d := Compare(k, exp)
	if want := []string{"anchor 10.96.0.0 of route 10.96.0.0/16", "route 10.96.0.0/16"}; !reflect.DeepEqual(d.Missing, want) {
		t.Errorf("missing %q, want %q", d.Missing, want)
	}
	if want := []string{"address 10.96.0.10 bound inside a routed range", "route 10.97.0.0/16"}; !reflect.DeepEqual(d.Leaks, want) {
		t.Errorf("leaks %q, want %q", d.Leaks, want)
	}
}

func TestCompare(t *testing.T) {
	exp := Expected{
		Virtual:       map[string][]string{"TCP 10.96.0.10:80": {"10.100.1.2:8080", "10.100.2.2:8080"}},
		Known:         map[string]bool{"TCP 10.0.2.15:30080": true, "UDP [fd00:10:96::a]:53": true},
		Addrs:         map[string]bool{"10.96.0.10": true},
		KnownAddrs:    map[string]bool{"fd00:10:96::a": true},
		ServiceCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		NodeAddrs:     []string{"10.0.2.15"},
		NodePortRange: [2]int{30000, 32767},
	}
	k := State{
		Virtual: ParseIPVS(ipvsadmOut),
		Addrs:   []string{"10.96.0.10", "fd00:10:96::a"},
		Sets: map[string][]string{
			"IPVSP-SERVICE":   {"10.0.2.15,tcp:30080", "10.96.0.10,tcp:80"},
			"IPVSP-VIP":       {"10.96.0.10"},
			"IPVSP-6-SERVICE": {"fd00:10:96::a,udp:53"},
			"IPVSP-6-VIP":     {"fd00:10:96::a"},
		},
	}
	// 10.96.0.99:80 is in the Service range and asked for by nobody: a
	// leak; 192.0.2.50:80 is another tool's.
	d := Compare(k, exp)
	if d.Converged() || len(d.Missing) != 0 || !reflect.DeepEqual(d.Leaks, []string{"virtual server TCP 10.96.0.99:80"}) {
		t.Fatalf("Compare = %s", d)
	}
	delete(k.Virtual, "TCP 10.96.0.99:80")
	if d := Compare(k, exp); !d.Converged() {
		t.Fatalf("Compare = %s, want converged", d)
	}

	// Damage: a real server gone, a stray one, a stray address and entry,
	// a destroyed set, the interface gone.
	k.Virtual["TCP 10.96.0.10:80"] = []string{"10.100.2.2:8080", "10.100.9.2:8080"}
	k.Addrs = append(k.Addrs, "10.96.5.5")
	k.Sets["IPVSP-SERVICE"] = append(k.Sets["IPVSP-SERVICE"], "10.96.5.5,tcp:80")
	delete(k.Sets, "IPVSP-VIP")
	d = Compare(k, exp)
	wantMissing := []string{"real server TCP 10.96.0.10:80 -> 10.100.1.2:8080", "set IPVSP-VIP"}
	wantLeaks := []string{"address 10.96.5.5", "entry 10.96.5.5,tcp:80 in IPVSP-SERVICE", "real server TCP 10.96.0.10:80 -> 10.100.9.2:8080"}
	if !reflect.DeepEqual(d.Missing, wantMissing) || !reflect.DeepEqual(d.Leaks, wantLeaks) {
		t.Errorf("Compare = %s\nwant missing %q leaks %q", d, wantMissing, wantLeaks)
	}
	k.Addrs = nil
	delete(k.Virtual, "TCP 10.96.0.10:80")
	d = Compare(k, exp)
	for _, m := range []string{"the proxy's interface", "virtual server TCP 10.96.0.10:80", "address 10.96.0.10"} {
		found := false
		for _, got := range d.Missing {
			found = found || got == m
		}
		if !found {
			t.Errorf("Compare = %s, want %q missing", d, m)
		}
	}
}
