package model_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// dvs is a virtual server "addr:port" (TCP) with a scheduler.
func dvs(addrPort, sched string) ktypes.VirtualServer {
	return ktypes.VirtualServer{VSKey: ktypestest.VSKey(addrPort, ktypes.TCP), Scheduler: sched}
}

// drs parses a real server as ktypestest.RS does: "addr:port" (weight 1),
// "addr:port@w", "addr:port@d" (weight 0, marked Drain), each optionally
// followed by the kernel's connection counts "#active" or
// "#active.inactive".
var drs = ktypestest.RS

func want(svc string, kind model.AddressKind, vs ktypes.VirtualServer, rss ...string) model.Want {
	ns, name, _ := strings.Cut(svc, "/")
	w := model.Want{Service: types.NamespacedName{Namespace: ns, Name: name}, VSPlan: model.VSPlan{VirtualServer: vs, Kind: kind}}
	for _, r := range rss {
		w.RealServers = append(w.RealServers, drs(r))
	}
	return w
}

func desired(addrs []string, ws ...model.Want) model.Desired {
	d := model.Desired{VirtualServers: map[ktypes.VSKey]model.Want{}, Addresses: map[netip.Addr]bool{}}
	for _, w := range ws {
		d.VirtualServers[w.VSKey] = w
	}
	for _, a := range addrs {
		d.Addresses[netip.MustParseAddr(a)] = true
	}
	return d
}

// kernel is a view: virtual servers with their real servers, and bound
// addresses.
type kvs struct {
	vs  ktypes.VirtualServer
	rss []string
}

func kernel(bound []string, vss ...kvs) *model.Kernel {
	var list []ktypes.VirtualServer
	var addrs []netip.Addr
	for _, v := range vss {
		list = append(list, v.vs)
	}
	for _, a := range bound {
		addrs = append(addrs, netip.MustParseAddr(a))
	}
	k := model.NewKernel(list, addrs)
	for _, v := range vss {
		for _, r := range v.rss {
			k.RealServers[v.vs.VSKey] = append(k.RealServers[v.vs.VSKey], drs(r))
		}
	}
	return k
}

func opStrings(ops []ktypes.Op) []string {
	out := make([]string, len(ops))
	for i, o := range ops {
		out[i] = o.String()
		if o.Service != (types.NamespacedName{}) {
			out[i] += " [" + o.Service.String() + "]"
		}
	}
	return out
}

func TestDiff(t *testing.T) {
	vip := dvs("10.96.0.10:80", "rr")
	vip2 := dvs("10.96.0.10:443", "rr")
	udpVIP := ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.96.0.10:53", ktypes.UDP), Scheduler: "rr"}
	other := dvs("10.96.0.11:80", "rr")
	node := dvs("192.168.0.10:30080", "rr")
	all := model.Scope{All: true}
	tests := []struct {
		name  string
		want  model.Desired
		have  *model.Kernel
		scope model.Scope
		ops   []string
	}{
		{
			name:  "nothing wanted, nothing held",
			want:  desired(nil),
			have:  kernel(nil),
			scope: all,
			ops:   []string{},
		},
		{
			name:  "a new Service: bind, add the virtual server, then its real servers",
			want:  desired([]string{"10.96.0.10"}, want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080", "10.0.2.2:8080")),
			have:  kernel(nil),
			scope: all,
			ops: []string{
				"bind 10.96.0.10",
				"add-virtual-server 10.96.0.10:80/TCP rr [ns/a]",
				"add-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 w=1 [ns/a]",
				"add-real-server 10.96.0.10:80/TCP 10.0.2.2:8080 w=1 [ns/a]",
			},
		},
		{
			name:  "in sync: no operation",
			want:  desired([]string{"10.96.0.10"}, want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080"}}),
			scope: all,
			ops:   []string{},
		},
		{
			name: "real servers: one added, one drained to weight 0, one deleted",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@0", "10.0.3.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080", "10.0.2.2:8080"}}),
			scope: all,
			ops: []string{
				"update-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 w=0 (was w=1) [ns/a]",
				"add-real-server 10.96.0.10:80/TCP 10.0.3.2:8080 w=1 [ns/a]",
				"delete-real-server 10.96.0.10:80/TCP 10.0.2.2:8080 [ns/a]",
			},
		},
		{
			name: "a not-serving endpoint the kernel does not hold is never added",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080", "10.0.2.2:8080@d")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080"}}),
			scope: all,
			ops:   []string{},
		},
		{
			name:  "a new virtual server gets its serving real servers only",
			want:  desired([]string{"10.96.0.10"}, want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@d", "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}),
			scope: all,
			ops: []string{
				"add-virtual-server 10.96.0.10:80/TCP rr [ns/a]",
				"add-real-server 10.96.0.10:80/TCP 10.0.2.2:8080 w=1 [ns/a]",
			},
		},
		{
			name: "a busy real server whose endpoint stops serving goes to weight 0",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@d", "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080#2", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{"update-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 w=0 drain (was w=1) [ns/a]"},
		},
		{
			name: "a draining real server with inactive connections only (UDP flows, closing TCP) stays",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@d", "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080@0#0.1", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{},
		},
		{
			name: "a draining real server goes when its connections end",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@d", "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080@0", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{"delete-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 [ns/a]"},
		},
		{
			name: "an idle real server whose endpoint stops serving goes at once",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.1.2:8080@d", "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{"delete-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 [ns/a]"},
		},
		{
			// Relabelled out of the selector, a port renamed: its TCP
			// connections go on, as in kube-proxy's IPVS mode.
			name: "a busy TCP real server whose endpoint left the slices stays, at weight 0",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080#3.4", "10.0.3.2:8080@0#0.1", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{"update-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 w=0 (was w=1) [ns/a]"},
		},
		{
			name: "an idle real server whose endpoint left the slices goes",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, vip, "10.0.2.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080@0", "10.0.2.2:8080"}}),
			scope: all,
			ops:   []string{"delete-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 [ns/a]"},
		},
		{
			// kube-proxy's rule: a UDP flow is scheduled afresh.
			name: "a busy UDP real server whose endpoint left the slices goes",
			want: desired([]string{"10.96.0.10"},
				want("ns/a", model.KindClusterIP, udpVIP, "10.0.2.2:5353")),
			have:  kernel([]string{"10.96.0.10"}, kvs{udpVIP, []string{"10.0.1.2:5353#0.3", "10.0.2.2:5353"}}),
			scope: all,
			ops:   []string{"delete-real-server 10.96.0.10:53/UDP 10.0.1.2:5353 [ns/a]"},
		},
		{
			name:  "a scheduler change updates the virtual server in place",
			want:  desired([]string{"10.96.0.10"}, want("ns/a", model.KindClusterIP, dvs("10.96.0.10:80", "sh"), "10.0.1.2:8080")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080"}}),
			scope: all,
			ops:   []string{"update-virtual-server 10.96.0.10:80/TCP sh (was 10.96.0.10:80/TCP rr) [ns/a]"},
		},
		{
			name:  "a deleted Service: its virtual server goes, then its address",
			want:  desired(nil),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080"}}),
			scope: all,
			ops:   []string{"delete-virtual-server 10.96.0.10:80/TCP", "unbind 10.96.0.10"},
		},
		{
			name:  "an address that still carries a wanted virtual server stays bound",
			want:  desired([]string{"10.96.0.10"}, want("ns/a", model.KindClusterIP, vip2, "10.0.1.2:8443")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, nil}, kvs{vip2, []string{"10.0.1.2:8443"}}),
			scope: all,
			ops:   []string{"delete-virtual-server 10.96.0.10:80/TCP"},
		},
		{
			name: "partial scope: only the listed virtual servers and addresses",
			want: desired([]string{"10.96.0.11"}, want("ns/b", model.KindClusterIP, other, "10.0.1.3:8080")),
			// The kernel's stray virtual server on 10.96.0.10 is out of
			// scope: a partial sync leaves it for the full one.
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, nil}),
			scope: model.Scope{Keys: []ktypes.VSKey{other.VSKey}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.11")}},
			ops: []string{
				"bind 10.96.0.11",
				"add-virtual-server 10.96.0.11:80/TCP rr [ns/b]",
				"add-real-server 10.96.0.11:80/TCP 10.0.1.3:8080 w=1 [ns/b]",
			},
		},
		{
			name: "an unwanted address in scope with a virtual server out of scope stays bound",
			want: desired(nil),
			have: kernel([]string{"10.96.0.10"}, kvs{vip, nil}, kvs{vip2, nil}),
			scope: model.Scope{Keys: []ktypes.VSKey{vip.VSKey},
				Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}},
			ops: []string{"delete-virtual-server 10.96.0.10:80/TCP"},
		},
		{
			name:  "node ports need no address",
			want:  desired(nil, want("ns/a", model.KindNodePort, node, "10.0.1.2:8080")),
			have:  kernel(nil),
			scope: all,
			ops: []string{
				"add-virtual-server 192.168.0.10:30080/TCP rr [ns/a]",
				"add-real-server 192.168.0.10:30080/TCP 10.0.1.2:8080 w=1 [ns/a]",
			},
		},
		{
			name:  "a handover to another Service keeps the virtual server",
			want:  desired([]string{"10.96.0.10"}, want("ns/b", model.KindExternalIP, vip, "10.0.9.9:80")),
			have:  kernel([]string{"10.96.0.10"}, kvs{vip, []string{"10.0.1.2:8080"}}),
			scope: model.Scope{Keys: []ktypes.VSKey{vip.VSKey}},
			ops: []string{
				"add-real-server 10.96.0.10:80/TCP 10.0.9.9:80 w=1 [ns/b]",
				"delete-real-server 10.96.0.10:80/TCP 10.0.1.2:8080 [ns/b]",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := opStrings(model.Diff(tt.want, tt.have, tt.scope))
			if diff := cmp.Diff(tt.ops, got); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
			// Room sizes the list only.
			tt.scope.Room = 1
			if diff := cmp.Diff(tt.ops, opStrings(model.Diff(tt.want, tt.have, tt.scope))); diff != "" {
				t.Errorf("ops with Room 1 (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAssign(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ext := func(svc string, at time.Time, addrPorts ...string) *model.ServicePlan {
		ns, name, _ := strings.Cut(svc, "/")
		p := &model.ServicePlan{Service: types.NamespacedName{Namespace: ns, Name: name}, Created: at}
		for _, ap := range addrPorts {
			p.VirtualServers = append(p.VirtualServers, model.VSPlan{VirtualServer: dvs(ap, "rr"), Kind: model.KindExternalIP})
		}
		return p
	}
	tests := []struct {
		name      string
		plans     []*model.ServicePlan
		holders   map[string]string
		conflicts []string
	}{
		{
			name:    "the older Service holds, whatever the order",
			plans:   []*model.ServicePlan{ext("z/young", t0.Add(time.Hour), "172.20.0.5:80"), ext("a/old", t0, "172.20.0.5:80")},
			holders: map[string]string{"172.20.0.5:80/TCP": "a/old"},
			conflicts: []string{
				"172.20.0.5:80/TCP: z/young loses to a/old",
			},
		},
		{
			name: "same creation time: the lower namespace/name holds",
			plans: []*model.ServicePlan{ext("b/x", t0, "172.20.0.5:80"), ext("a/y", t0, "172.20.0.5:80"),
				ext("a/x", t0, "172.20.0.5:80")},
			holders:   map[string]string{"172.20.0.5:80/TCP": "a/x"},
			conflicts: []string{"172.20.0.5:80/TCP: a/y loses to a/x", "172.20.0.5:80/TCP: b/x loses to a/x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, cs := model.Assign(tt.plans, model.Ownership{})
			holders := map[string]string{}
			for k, w := range d.VirtualServers {
				holders[k.String()] = w.Service.String()
			}
			if diff := cmp.Diff(tt.holders, holders); diff != "" {
				t.Errorf("holders (-want +got):\n%s", diff)
			}
			var got []string
			for _, c := range cs {
				got = append(got, c.VirtualServer.String()+": "+c.Loser.String()+" loses to "+c.Holder.String())
			}
			if diff := cmp.Diff(tt.conflicts, got); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDraining(t *testing.T) {
	vip := dvs("10.96.0.10:80", "rr")
	for _, tc := range []struct {
		name   string
		want   []string
		kernel []string
		drains bool
	}{
		{"no drain marking", []string{"10.0.1.2:8080", "10.0.2.2:8080@0"}, []string{"10.0.1.2:8080#1", "10.0.2.2:8080@0#1"}, false},
		{"marked, busy", []string{"10.0.1.2:8080@d", "10.0.2.2:8080"}, []string{"10.0.1.2:8080@0#1", "10.0.2.2:8080"}, true},
		{"marked, inactive connections only", []string{"10.0.1.2:8080@d"}, []string{"10.0.1.2:8080@0#0.2"}, true},
		{"marked, idle", []string{"10.0.1.2:8080@d", "10.0.2.2:8080"}, []string{"10.0.1.2:8080@0", "10.0.2.2:8080#5"}, false},
		{"marked, not in the kernel", []string{"10.0.1.2:8080@d", "10.0.2.2:8080"}, []string{"10.0.2.2:8080#5"}, false},
		{"left the slices, busy", []string{"10.0.2.2:8080"}, []string{"10.0.1.2:8080@0#0.1", "10.0.2.2:8080"}, true},
		{"left the slices, idle", []string{"10.0.2.2:8080"}, []string{"10.0.1.2:8080@0", "10.0.2.2:8080#2"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := want("ns/a", model.KindClusterIP, vip, tc.want...)
			var rss []ktypes.RealServer
			for _, r := range tc.kernel {
				rss = append(rss, drs(r))
			}
			if got := model.Draining(w.VSPlan, rss); got != tc.drains {
				t.Errorf("Draining = %v, want %v", got, tc.drains)
			}
		})
	}
}

// TestDiffRoutes: a Service range routed as local through the interface
// replaces its clusterIPs' addresses, in an order that never leaves a
// virtual server unowned: the route before the unbinds, binds before the
// route goes, and a route kept while a virtual server in it is on no
// bound address.
func TestDiffRoutes(t *testing.T) {
	routes := func(ps ...string) map[netip.Prefix]bool {
		m := map[netip.Prefix]bool{}
		for _, p := range ps {
			m[netip.MustParsePrefix(p)] = true
		}
		return m
	}
	a := want("default/a", model.KindClusterIP, dvs("10.96.0.10:80", "rr"), "10.244.1.5:8080")
	b := want("default/b", model.KindClusterIP, dvs("10.96.0.11:80", "rr"), "10.244.1.6:8080")
	kvsA := kvs{dvs("10.96.0.10:80", "rr"), []string{"10.244.1.5:8080"}}
	kvsB := kvs{dvs("10.96.0.11:80", "rr"), []string{"10.244.1.6:8080"}}
	for _, tc := range []struct {
		name  string
		want  model.Desired
		have  *model.Kernel
		scope model.Scope
		ops   []string
	}{{
		name: "cold: the route first, nothing bound",
		want: func() model.Desired { d := desired(nil, a); d.Routes = routes("10.96.0.0/16"); return d }(),
		have: kernel(nil), scope: model.Scope{All: true},
		ops: []string{"route 10.96.0.0/16", "add-virtual-server 10.96.0.10:80/TCP rr [default/a]",
			"add-real-server 10.96.0.10:80/TCP 10.244.1.5:8080 w=1 [default/a]"},
	}, {
		name: "from one address per clusterIP to the range: routed, then unbound with the virtual servers kept",
		want: func() model.Desired { d := desired(nil, a, b); d.Routes = routes("10.96.0.0/16"); return d }(),
		have: kernel([]string{"10.96.0.10", "10.96.0.11"}, kvsA, kvsB), scope: model.Scope{All: true},
		ops: []string{"route 10.96.0.0/16", "unbind 10.96.0.10", "unbind 10.96.0.11"},
	}, {
		name: "a partial sync unbinds an address the kernel's route holds; it never touches routes",
		want: func() model.Desired { d := desired(nil, a); d.Routes = routes("10.96.0.0/16"); return d }(),
		have: func() *model.Kernel {
			k := kernel([]string{"10.96.0.10"}, kvsA)
			k.Routes = routes("10.96.0.0/16")
			return k
		}(),
		scope: model.Scope{Keys: []ktypes.VSKey{a.VSKey}, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}},
		ops:   []string{"unbind 10.96.0.10"},
	}, {
		name:  "back to one address per clusterIP: bound, then the route goes",
		want:  desired([]string{"10.96.0.10", "10.96.0.11"}, a, b),
		have:  func() *model.Kernel { k := kernel(nil, kvsA, kvsB); k.Routes = routes("10.96.0.0/16"); return k }(),
		scope: model.Scope{All: true},
		ops:   []string{"bind 10.96.0.10", "bind 10.96.0.11", "unroute 10.96.0.0/16"},
	}, {
		name:  "an unwanted route stays while a virtual server in it is on no bound address",
		want:  func() model.Desired { d := desired(nil, a); d.Routes = routes("10.97.0.0/16"); return d }(),
		have:  func() *model.Kernel { k := kernel(nil, kvsA); k.Routes = routes("10.96.0.0/16"); return k }(),
		scope: model.Scope{All: true},
		ops:   []string{"route 10.97.0.0/16"},
	}, {
		name:  "an unwanted route goes with the last virtual server in it",
		want:  desired(nil),
		have:  func() *model.Kernel { k := kernel(nil, kvsA); k.Routes = routes("10.96.0.0/16"); return k }(),
		scope: model.Scope{All: true},
		ops:   []string{"delete-virtual-server 10.96.0.10:80/TCP", "unroute 10.96.0.0/16"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want.Routes == nil {
				tc.want.Routes = map[netip.Prefix]bool{}
			}
			if diff := cmp.Diff(tc.ops, opStrings(model.Diff(tc.want, tc.have, tc.scope))); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDiffColdSyncSized: a cold sync's operations fit the room Diff makes
// for them, routes included: one more would copy the whole list into a new
// array at its end (at 10,000 Services, 10 MB beside the first 8).
func TestDiffColdSyncSized(t *testing.T) {
	var ws []model.Want
	for i := range 300 {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)})
		ws = append(ws, want("default/s", model.KindClusterIP, dvs(a.String()+":80", "rr"), "10.0.1.2:8080", "10.0.1.3:8080"))
	}
	d := desired(nil, ws...)
	d.Routes = map[netip.Prefix]bool{netip.MustParsePrefix("10.96.0.0/16"): true}
	ops := model.Diff(d, model.NewKernel(nil, nil), model.Scope{All: true})
	if len(ops) != 1+300*3 {
		t.Fatalf("%d ops, want %d", len(ops), 1+300*3)
	}
	if cap(ops) != len(ops) {
		t.Errorf("room for %d ops, %d written: the list grew (or was oversized)", cap(ops), len(ops))
	}
}

const drainingBenchN = 1000

// BenchmarkDraining: the drain check runs for every virtual server of a
// sync's scope; with drainingBenchN busy real servers, all still planned.
func BenchmarkDraining(b *testing.B) {
	var rss []string
	for i := range drainingBenchN {
		rss = append(rss, fmt.Sprintf("10.1.%d.%d:8080", i/250, i%250+1))
	}
	w := want("ns/a", model.KindClusterIP, dvs("10.96.0.10:80", "rr"), rss...)
	kernel := make([]ktypes.RealServer, len(w.RealServers))
	for i, rs := range w.RealServers {
		kernel[i] = ktypes.RealServer{RSKey: rs.RSKey, Weight: 1, ActiveConns: 3}
	}
	b.ReportAllocs()
	for b.Loop() {
		if model.Draining(w.VSPlan, kernel) {
			b.Fatal("draining with every real server planned")
		}
	}
}

// TestKernelReserve: sizing an empty view ahead keeps it working; a view
// that holds something keeps it.
func TestKernelReserve(t *testing.T) {
	a := netip.MustParseAddr("10.96.0.10")
	held := model.NewKernel([]ktypes.VirtualServer{dvs("10.96.0.10:80", "rr")}, []netip.Addr{a})
	held.Reserve(1000)
	if _, ok := held.VirtualServers[ktypestest.VSKey("10.96.0.10:80", ktypes.TCP)]; !ok || !held.Bound[a] || held.OnAddress(a) != 1 {
		t.Errorf("Reserve on a view that holds a virtual server and an address lost them: %+v, on address %d", held, held.OnAddress(a))
	}
	empty := model.NewKernel(nil, nil)
	empty.Reserve(1000)
	empty.PutVirtualServer(dvs("10.96.0.10:80", "rr"))
	empty.PutVirtualServer(dvs("10.96.0.10:443", "rr"))
	empty.Bound[a] = true
	if empty.OnAddress(a) != 2 || len(empty.VirtualServers) != 2 {
		t.Errorf("reserved view after two puts: %d virtual servers, %d on %s; want 2, 2", len(empty.VirtualServers), empty.OnAddress(a), a)
	}
}
