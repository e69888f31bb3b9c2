package workload

import (
	"net/netip"
	"testing"
)

// TestEndpointAddrLayout: every endpoint of the bench's shapes is its own
// even address inside 10.176.0.0/12, whose neighbour (the last bit
// flipped, where a change moves it) is no other endpoint; the first
// 32,767 Services of two keep the first layout (16 apart).
func TestEndpointAddrLayout(t *testing.T) {
	r := netip.MustParsePrefix("10.176.0.0/12")
	for _, sh := range []struct{ n, per int }{{1000, 2}, {50000, 2}, {65534, 2}, {5000, 50}, {5000, 100}, {2000, 50}} {
		if sh.per > MaxEndpoints(sh.n) {
			t.Fatalf("%dx%d: MaxEndpoints = %d", sh.n, sh.per, MaxEndpoints(sh.n))
		}
		seen := make(map[netip.Addr]bool, sh.n*sh.per*2)
		for i := range sh.n {
			for k := range sh.per {
				a := netip.MustParseAddr(EndpointAddr(i, k, sh.per))
				b := a.As4()
				if !r.Contains(a) || b[3]%2 != 0 {
					t.Fatalf("%dx%d: endpoint %d of Service %d is %v: want an even address in %v", sh.n, sh.per, k, i, a, r)
				}
				b[3]++
				moved := netip.AddrFrom4(b)
				if seen[a] || seen[moved] {
					t.Fatalf("%dx%d: endpoint %d of Service %d (%v) or its neighbour is another's", sh.n, sh.per, k, i, a)
				}
				seen[a], seen[moved] = true, true
			}
		}
	}
	if got := EndpointAddr(32766, 1, 2); got != "10.191.255.224" {
		t.Errorf("EndpointAddr(32766, 1, 2) = %s, want the first layout's 10.183.255.240", got)
	}
	if MaxEndpoints(65535) != 0 {
		t.Errorf("MaxEndpoints(65535) = %d: past the layout's 65,534 Services", MaxEndpoints(65535))
	}
}
