package agent

import "net/netip"

// The fake node of the agent's tests: its address and its interface.
const testIface = "ipvs-proxy0"

var node = netip.MustParseAddr("192.168.0.10")
