package model_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestDiffForwarding: a real server whose forwarding method or GUE port
// differs from the plan's is updated in place (never deleted and added:
// the kernel's connections on it go on), for ordered (mh) virtual servers
// too without moving anything; an equal one gets no write; a busy real
// server that left the plan drains at weight 0 with its tunnel kept.
func TestDiffForwarding(t *testing.T) {
	lb := dvs("192.168.56.210:80", "rr")
	mh := dvs("192.168.56.210:443", "mh")
	tests := []struct {
		name string
		vs   ktypes.VirtualServer
		want []string // the plan's real servers
		have []string // the kernel's, head first
		ops  []string
	}{
		{"nat to tunnel", lb, []string{"10.244.1.2:8080 tunnel"}, []string{"10.244.1.2:8080"},
			[]string{"update-real-server 192.168.56.210:80/TCP 10.244.1.2:8080 w=1 tunnel (was w=1 nat) [ns/a]"}},
		{"tunnel to gue", lb, []string{"10.244.1.2:8080 gue:6080"}, []string{"10.244.1.2:8080 tunnel"},
			[]string{"update-real-server 192.168.56.210:80/TCP 10.244.1.2:8080 w=1 gue:6080 (was w=1 tunnel) [ns/a]"}},
		{"gue port changed", lb, []string{"10.244.1.2:8080 gue:6081"}, []string{"10.244.1.2:8080 gue:6080"},
			[]string{"update-real-server 192.168.56.210:80/TCP 10.244.1.2:8080 w=1 gue:6081 (was w=1 gue:6080) [ns/a]"}},
		{"gue back to nat with a weight change", lb, []string{"10.244.1.2:8080@0"}, []string{"10.244.1.2:8080 gue:6080"},
			[]string{"update-real-server 192.168.56.210:80/TCP 10.244.1.2:8080 w=0 (was w=1 gue:6080) [ns/a]"}},
		{"equal: no write", lb, []string{"10.244.1.2:8080 gue:6080", "10.244.2.2:8080 tunnel", "10.244.3.2:8080"},
			[]string{"10.244.3.2:8080", "10.244.2.2:8080 tunnel", "10.244.1.2:8080 gue:6080"}, []string{}},
		{"a busy real server that left the plan keeps its tunnel at weight 0", lb, []string{"10.244.1.2:8080 gue:6080"},
			[]string{"10.244.1.2:8080 gue:6080", "10.244.9.2:8080#1 gue:6080"},
			[]string{"update-real-server 192.168.56.210:80/TCP 10.244.9.2:8080 w=0 gue:6080 (was w=1) [ns/a]"}},
		{"ordered: updated in place, nothing moves", mh, []string{"10.244.1.2:8080 tunnel", "10.244.2.2:8080 gue:6080"},
			[]string{"10.244.1.2:8080", "10.244.2.2:8080 tunnel"},
			[]string{
				"update-real-server 192.168.56.210:443/TCP 10.244.1.2:8080 w=1 tunnel (was w=1 nat) [ns/a]",
				"update-real-server 192.168.56.210:443/TCP 10.244.2.2:8080 w=1 gue:6080 (was w=1 tunnel) [ns/a]",
			}},
		{"ordered, equal: no write", mh, []string{"10.244.1.2:8080 gue:6080", "10.244.2.2:8080 gue:6080"},
			[]string{"10.244.1.2:8080 gue:6080", "10.244.2.2:8080 gue:6080"}, []string{}},
		{"ordered: a draining mh real server is added with its tunnel", mh, []string{"10.244.1.2:8080@0 tunnel"}, nil,
			[]string{
				"add-real-server 192.168.56.210:443/TCP 10.244.1.2:8080 w=1 tunnel [ns/a]",
				"update-real-server 192.168.56.210:443/TCP 10.244.1.2:8080 w=0 tunnel (was w=1) [ns/a]",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := desired([]string{"192.168.56.210"}, want("ns/a", model.KindLoadBalancer, tt.vs, tt.want...))
			k := kernel([]string{"192.168.56.210"}, kvs{tt.vs, tt.have})
			got := opStrings(model.Diff(d, k, model.Scope{All: true}))
			if diff := cmp.Diff(tt.ops, got); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
		})
	}
}
