package netlinkutil

import (
	"bufio"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
)

// TestParseProcTable reads the kernel's text table (as Linux 6.1 prints
// it): IPv4 and IPv6 virtual servers with their destinations (a tunnel's
// method without its type, direct routing as foreign), one without any, a fwmark one whose destinations are left out, and one shown twice
// (the file is read a page at a time) whose destinations count once.
func TestParseProcTable(t *testing.T) {
	const table = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr 
  -> 0A000102:1F90      Masq    1      3          7         
  -> 0A000202:1F90      Masq    0      0          0         
UDP  0A60000A:0035 sh persistent 600 FFFFFFFF
TCP  C0A838D2:0050 mh 
  -> 0AF40102:1F90      Tunnel  1      1          0         
  -> 0AF40202:1F90      Route   1      0          0         
SCTP  [fd00:0010:0096:0000:0000:0000:0000:0010]:01BB mh 
  -> [fd00:0001:0000:0000:0000:0000:0000:0002]:20FB      Masq    3      0          0         
FWM  00000001 rr 
  -> 0A000302:0050      Masq    1      0          0         
TCP  0A60000A:0050 rr 
  -> 0A000102:1F90      Masq    1      3          7         
  -> 0A000202:1F90      Masq    0      0          0         
`
	route := ktypestest.RS("10.244.2.2:8080")
	route.Forward = ForwardForeign
	got, err := parseProcTable(bufio.NewReader(strings.NewReader(table)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[ktypes.VSKey][]ktypes.RealServer{
		ktypestest.VSKey("10.96.0.10:80", ktypes.TCP):         ktypestest.RSs("10.0.1.2:8080@1#3.7", "10.0.2.2:8080@0"),
		ktypestest.VSKey("10.96.0.10:53", ktypes.UDP):         {},
		ktypestest.VSKey("192.168.56.210:80", ktypes.TCP):     {ktypestest.RS("10.244.1.2:8080#1 tunnel"), route},
		ktypestest.VSKey("[fd00:10:96::10]:443", ktypes.SCTP): ktypestest.RSs("[fd00:1::2]:8443@3"),
	}
	if diff := cmp.Diff(want, got, addrCmp); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"TCP  0A60000A rr\n", "TCP  0A60000A:0050 rr\n  -> 0A000102:1F90 Masq x 0 0\n", "TCP  0A6000:0050 rr\n"} {
		if _, err := parseProcTable(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("parsed %q without an error", bad)
		}
	}
}

// BenchmarkParseProcTable reads a table of 5,000 virtual servers of 50
// destinations each (the bench's 5,000 × 50), as every periodic resync
// does: the allocations are the map's and its lists', none per line.
func BenchmarkParseProcTable(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n")
	for i := range 5000 {
		fmt.Fprintf(&sb, "TCP  0A60%04X:0050 rr \n", i)
		for k := range 50 {
			fmt.Fprintf(&sb, "  -> 0A%06X:1F90      Masq    1      0          0         \n", 0xB00000+i*50+k)
		}
	}
	table := sb.String()
	b.SetBytes(int64(len(table)))
	b.ReportAllocs()
	for b.Loop() {
		out, err := parseProcTable(bufio.NewReaderSize(strings.NewReader(table), 64<<10))
		if err != nil || len(out) != 5000 {
			b.Fatalf("%d virtual servers, %v", len(out), err)
		}
	}
}
