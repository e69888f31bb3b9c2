// Package ktypestest builds the kernel's value types (package ktypes) from
// short strings, for the tests of every package that handles them (the
// kernel adapters, the model, the reconciler, the glue), so that each
// writes its cases the same way.
package ktypestest

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// VSKey is the virtual server "addr:port" of a protocol.
func VSKey(addrPort string, proto ktypes.Protocol) ktypes.VSKey {
	ap := netip.MustParseAddrPort(addrPort)
	return ktypes.VSKey{Address: ap.Addr(), Protocol: proto, Port: ap.Port()}
}

// RS parses a real server: "addr:port" (weight 1), "addr:port@W" (weight
// W), "addr:port@d" (weight 0, marked Drain), each optionally followed by
// the kernel's connection counts "#active" or "#active.inactive", and by a
// forwarding method as RealServer.String shows it (" tunnel", " gue:6080";
// NAT without). It panics on a malformed string, as the netip.Must
// functions do.
func RS(s string) ktypes.RealServer {
	rs := ktypes.RealServer{Weight: 1}
	if a, fwd, ok := strings.Cut(s, " "); ok {
		s = a
		rs.Forward, rs.TunPort = parseForward(fwd)
	}
	if a, conns, ok := strings.Cut(s, "#"); ok {
		s = a
		act, inact, _ := strings.Cut(conns, ".")
		rs.ActiveConns = int32(mustAtoi(act))
		if inact != "" {
			rs.InactiveConns = int32(mustAtoi(inact))
		}
	}
	if a, w, ok := strings.Cut(s, "@"); ok {
		s = a
		if w == "d" {
			rs.Weight, rs.Drain = 0, true
		} else {
			rs.Weight = int32(mustAtoi(w))
		}
	}
	ap := netip.MustParseAddrPort(s)
	rs.RSKey = ktypes.RSKey{Address: ap.Addr(), Port: ap.Port()}
	return rs
}

// RSs parses real servers with RS; nil when there are none.
func RSs(ss ...string) []ktypes.RealServer {
	var out []ktypes.RealServer
	for _, s := range ss {
		out = append(out, RS(s))
	}
	return out
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic("ktypestest: " + err.Error())
	}
	return n
}

func parseForward(s string) (ktypes.Forward, uint16) {
	if s == "tunnel" {
		return ktypes.ForwardTunnel, 0
	}
	if port, ok := strings.CutPrefix(s, "gue:"); ok {
		return ktypes.ForwardGUE, uint16(mustAtoi(port))
	}
	panic("ktypestest: forwarding method " + s)
}
