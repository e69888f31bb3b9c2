package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/opsserver"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

var (
	stNodeAddr = netip.MustParseAddr("192.168.1.10")
	stExcluded = netip.MustParsePrefix("10.200.0.0/16")
)

func statusConfig() agent.Config {
	return agent.Config{NodeName: "node-1", Interface: "ipvs-proxy0", Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, ExcludeCIDRs: []netip.Prefix{stExcluded}, IPv4: true, IPv6: true}
}

func stService(name, ip string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func stSlice(svc string, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8080))}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-1")})
	}
	return s
}

// statusObjects: a ClusterIP Service, a NodePort one with an unnamed port,
// one with persistence and the sh scheduler with a flag, whose externalIP
// is in --exclude-cidrs (programmed all the same: the range only keeps what
// no Service wants from being cleaned up).
func statusObjects() []runtime.Object {
	return []runtime.Object{
		stService("web", "10.96.0.10"), stSlice("web", "10.0.1.1", "10.0.1.2"),
		stService("np", "10.96.0.11", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports = []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 8000, NodePort: 30080, TargetPort: intstr.FromInt32(8080)}}
		}),
		func() *discoveryv1.EndpointSlice {
			s := stSlice("np", "10.0.2.1")
			s.Ports[0].Name = ptr.To("")
			return s
		}(),
		stService("sticky", "10.96.0.12", func(s *corev1.Service) {
			s.Annotations = map[string]string{scheduler.AnnotationScheduler: "sh", scheduler.AnnotationFlags: "sh-port"}
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.ExternalIPs = []string{"10.200.0.5"}
		}), stSlice("sticky", "10.0.3.1"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	}
}

// programmed returns a fake kernel programmed by the reconciler from the
// objects, as run would program it, plus a virtual server of another tool.
func programmed(t *testing.T, objs []runtime.Object) (*fake.IPVS, *fake.Links) {
	t.Helper()
	ipvs, links := fake.NewIPVS(), fake.NewLinks(stNodeAddr)
	cfg := statusConfig()
	rec := reconciler.NewReconciler(ipvs, links, reconciler.Config{Ownership: cfg.Ownership()}, zap.NewNop())
	node := model.NodeInfo{Name: cfg.NodeName, NodePortAddresses: []netip.Addr{stNodeAddr}}
	bcfg := model.BuildConfig{Scheduler: cfg.Scheduler, IPv4: true, IPv6: true}
	slicesOf := map[string][]*discoveryv1.EndpointSlice{}
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slicesOf[s.Labels[discoveryv1.LabelServiceName]] = append(slicesOf[s.Labels[discoveryv1.LabelServiceName]], s)
		}
	}
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok {
			plan := model.Build(model.ServiceOf(svc), model.SlicesOf(slicesOf[svc.Name]), node, bcfg)
			rec.SetPlan(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, &plan)
		}
	}
	if _, err := rec.Sync(true); err != nil {
		t.Fatal(err)
	}
	// Another tool's virtual server, on an address that is not ours.
	other := ktypes.VirtualServer{VSKey: vsKey("172.16.0.1", 80), Scheduler: "wlc"}
	if err := ipvs.AddVirtualServer(other); err != nil {
		t.Fatal(err)
	}
	return ipvs, links
}

func vsKey(addr string, port uint16) ktypes.VSKey {
	return ktypes.VSKey{Address: netip.MustParseAddr(addr), Protocol: ktypes.TCP, Port: port}
}

func rsKey(addr string) ktypes.RSKey {
	return ktypes.RSKey{Address: netip.MustParseAddr(addr), Port: 8080}
}

func collect(t *testing.T, ipvs *fake.IPVS, links *fake.Links, client kubernetes.Interface, apiErr error) Report {
	t.Helper()
	rep, err := Collect(context.Background(), statusConfig(), ipvs, links, kubetest.New(client), apiErr, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func findVS(rep Report, k ktypes.VSKey) *statusVirtualServer {
	for i := range rep.VirtualServers {
		if rep.VirtualServers[i].key == k {
			return &rep.VirtualServers[i]
		}
	}
	return nil
}

func TestStatusNoDrift(t *testing.T) {
	objs := statusObjects()
	ipvs, links := programmed(t, objs)
	rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
	if !rep.API.Available || !rep.DriftKnown || rep.API.Services != 3 {
		t.Errorf("api %+v driftKnown %v, want available with 3 Services", rep.API, rep.DriftKnown)
	}
	if len(rep.Drift) != 0 {
		t.Errorf("drift right after the reconciler's sync: %+v", rep.Drift)
	}
	if rep.OtherVirtualServers != 1 {
		t.Errorf("other virtual servers: %d, want 1 (another tool's)", rep.OtherVirtualServers)
	}
	want := []struct {
		key       ktypes.VSKey
		service   string
		kind      string
		scheduler string
		flags     []string
		timeout   uint32
		rss       []string
	}{
		{vsKey("10.96.0.10", 80), "ns/web:http", "ClusterIP", "rr", nil, 0, []string{"10.0.1.1", "10.0.1.2"}},
		{vsKey("10.96.0.11", 8000), "ns/np:8000", "ClusterIP", "rr", nil, 0, []string{"10.0.2.1"}},
		{vsKey("192.168.1.10", 30080), "ns/np:8000", "NodePort", "rr", nil, 0, []string{"10.0.2.1"}},
		{vsKey("10.96.0.12", 80), "ns/sticky:http", "ClusterIP", "sh", []string{"persistent", "sh-port"}, 10800, []string{"10.0.3.1"}},
		{vsKey("10.200.0.5", 80), "ns/sticky:http", "ExternalIP", "sh", []string{"persistent", "sh-port"}, 10800, []string{"10.0.3.1"}},
	}
	if len(rep.VirtualServers) != len(want) {
		t.Errorf("%d virtual servers, want %d: %+v", len(rep.VirtualServers), len(want), rep.VirtualServers)
	}
	for _, w := range want {
		vs := findVS(rep, w.key)
		if vs == nil {
			t.Errorf("no virtual server %s", w.key)
			continue
		}
		var rss []string
		for _, rs := range vs.RealServers {
			rss = append(rss, rs.Address)
			if rs.Port != 8080 || rs.Weight != 1 || !rs.InKernel || rs.Drift != "" {
				t.Errorf("%s: real server %+v", w.key, rs)
			}
		}
		if vs.Service != w.service || vs.Kind != w.kind || vs.Scheduler != w.scheduler || !slices.Equal(vs.Flags, w.flags) ||
			vs.PersistenceTimeout != w.timeout || !slices.Equal(rss, w.rss) || !vs.InKernel || !vs.Wanted || len(vs.Drift) > 0 {
			t.Errorf("%s = %+v, want %+v", w.key, *vs, w)
		}
	}
	// Sorted by Service, then virtual server.
	var order []string
	for _, vs := range rep.VirtualServers {
		order = append(order, vs.key.String())
	}
	if want := []string{"10.96.0.11:8000/TCP", "192.168.1.10:30080/TCP", "10.96.0.12:80/TCP", "10.200.0.5:80/TCP", "10.96.0.10:80/TCP"}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
}

// TestStatusReadsRealServersInBulk: status reads every virtual server's
// real servers in one bulk read, as the reconciler does, and reads alone
// only those the bulk read left out; the report is the same either way.
func TestStatusReadsRealServersInBulk(t *testing.T) {
	objs := statusObjects()
	ipvs, links := programmed(t, objs)
	reads := func() (bulk, single []string) {
		for _, c := range ipvs.Calls() {
			switch s := string(c); {
			case s == "ListAllRealServers":
				bulk = append(bulk, s)
			case strings.HasPrefix(s, "ListRealServers"):
				single = append(single, s)
			}
		}
		return bulk, single
	}
	ipvs.ResetCalls()
	whole := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
	if bulk, single := reads(); len(bulk) != 1 || len(single) != 0 {
		t.Errorf("reads of real servers: %v and %v; want one bulk read and none alone", bulk, single)
	}

	left := vsKey("10.96.0.11", 8000)
	ipvs.SkipInBulkRead(left)
	ipvs.ResetCalls()
	rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
	if bulk, single := reads(); len(bulk) != 1 || !slices.Equal(single, []string{"ListRealServers " + left.String()}) {
		t.Errorf("reads of real servers: %v and %v; want one bulk read and %s alone", bulk, single, left)
	}
	a, errA := json.MarshalIndent(whole, "", " ")
	b, errB := json.MarshalIndent(rep, "", " ")
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if diff := cmp.Diff(string(a), string(b)); diff != "" {
		t.Errorf("report with a virtual server left out of the bulk read (-whole +got):\n%s", diff)
	}
}

// checkForwardDrift checks the one drift of a real server (want) of
// 10.96.0.10:80: its row in the report and in the table, and the detail.
func checkForwardDrift(t *testing.T, rep Report, want statusRealServer, detail, row string) {
	t.Helper()
	var got []statusRealServer
	for _, rs := range findVS(rep, vsKey("10.96.0.10", 80)).RealServers {
		if rs.Address == want.Address {
			got = append(got, rs)
		}
	}
	if diff := cmp.Diff([]statusRealServer{want}, got, cmpopts.IgnoreUnexported(statusRealServer{})); diff != "" {
		t.Errorf("real server (-want +got):\n%s", diff)
	}
	if len(rep.Drift) != 1 || rep.Drift[0].Detail != detail {
		t.Errorf("drift %+v, want one: %q", rep.Drift, detail)
	}
	var text bytes.Buffer
	if err := Write(&text, rep, "text"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), row) {
		t.Errorf("the table has no row with %q:\n%s", row, text.String())
	}
}

func TestStatusDrift(t *testing.T) {
	web := vsKey("10.96.0.10", 80)
	tests := []struct {
		name   string
		mutate func(t *testing.T, ipvs *fake.IPVS, links *fake.Links)
		// drift kinds by virtual server
		want  map[string][]string
		other int
		check func(t *testing.T, rep Report)
	}{
		{
			name: "a real server deleted by hand",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.DeleteRealServer(web, rsKey("10.0.1.1")))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftMissingRS}},
			check: func(t *testing.T, rep Report) {
				rs := findVS(rep, web).RealServers
				if len(rs) != 2 || rs[0].Address != "10.0.1.1" || rs[0].Drift != "missing" || rs[0].InKernel || !rs[1].InKernel {
					t.Errorf("real servers %+v: want 10.0.1.1 missing, 10.0.1.2 in the kernel", rs)
				}
				if !strings.Contains(rep.Drift[0].Detail, "10.0.1.1:8080 w=1 is wanted, not in the kernel") || rep.Drift[0].Service != "ns/web:http" {
					t.Errorf("drift %+v", rep.Drift[0])
				}
			},
		},
		{
			name: "an extra real server and a different weight",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.AddRealServer(web, ktypes.RealServer{RSKey: rsKey("10.0.9.9"), Weight: 1}))
				must(t, ipvs.UpdateRealServer(web, ktypes.RealServer{RSKey: rsKey("10.0.1.2"), Weight: 5}))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftWeight, driftExtraRS}},
			check: func(t *testing.T, rep Report) {
				for _, rs := range findVS(rep, web).RealServers {
					if rs.Address == "10.0.1.2" && (rs.Drift != "weight" || rs.Weight != 5 || rs.WantWeight == nil || *rs.WantWeight != 1) {
						t.Errorf("real server %+v: want weight drift 5, wanted 1", rs)
					}
				}
			},
		},
		{
			name: "a different forwarding method",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.UpdateRealServer(web, ktypes.RealServer{RSKey: rsKey("10.0.1.1"), Weight: 1, Forward: ktypes.ForwardGUE, TunPort: 6080}))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftForward}},
			check: func(t *testing.T, rep Report) {
				checkForwardDrift(t, rep, statusRealServer{Address: "10.0.1.1", Port: 8080, Weight: 1, InKernel: true,
					Forward: "gue:6080", Drift: "forwarding", WantForward: "nat"},
					"real server 10.0.1.1:8080 is forwarded by gue:6080, wanted nat", "10.0.1.1:8080  1 gue:6080 (want nat)")
			},
		},
		{
			name: "a different forwarding method and weight",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.UpdateRealServer(web, ktypes.RealServer{RSKey: rsKey("10.0.1.2"), Weight: 5, Forward: ktypes.ForwardTunnel}))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftForward}},
			check: func(t *testing.T, rep Report) {
				checkForwardDrift(t, rep, statusRealServer{Address: "10.0.1.2", Port: 8080, Weight: 5, InKernel: true,
					Forward: "tunnel", Drift: "weight,forwarding", WantWeight: ptr.To[int32](1), WantForward: "nat"},
					"real server 10.0.1.2:8080 has weight 5, wanted 1; it is forwarded by tunnel, wanted nat",
					"10.0.1.2:8080  5 (want 1) tunnel (want nat)")
			},
		},
		{
			name: "a different scheduler",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.UpdateVirtualServer(ktypes.VirtualServer{VSKey: web, Scheduler: "wrr"}))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftDifferentVS}},
			check: func(t *testing.T, rep Report) {
				if d := rep.Drift[0].Detail; d != "kernel has 10.96.0.10:80/TCP wrr, wanted 10.96.0.10:80/TCP rr" {
					t.Errorf("detail %q", d)
				}
			},
		},
		{
			name: "different persistence",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				k := vsKey("10.96.0.12", 80)
				must(t, ipvs.UpdateVirtualServer(ktypes.VirtualServer{VSKey: k, Scheduler: "sh",
					Flags: ktypes.FlagPersistent | ktypes.FlagSched2, Timeout: 60}))
			},
			want: map[string][]string{"10.96.0.12:80/TCP": {driftDifferentVS}},
		},
		{
			name: "a virtual server deleted by hand",
			mutate: func(t *testing.T, ipvs *fake.IPVS, _ *fake.Links) {
				must(t, ipvs.DeleteVirtualServer(web))
			},
			want: map[string][]string{"10.96.0.10:80/TCP": {driftMissingVS}},
			check: func(t *testing.T, rep Report) {
				vs := findVS(rep, web)
				if vs.InKernel || !vs.Wanted || vs.Service != "ns/web:http" || len(vs.RealServers) != 2 || vs.RealServers[0].Drift != "missing" {
					t.Errorf("%+v: want a wanted, missing virtual server with its 2 real servers missing", *vs)
				}
			},
		},
		{
			name: "owned virtual servers no Service wants; others left alone",
			mutate: func(t *testing.T, ipvs *fake.IPVS, links *fake.Links) {
				// On a bound address: owned.
				must(t, links.AddAddress("ipvs-proxy0", netip.MustParseAddr("10.96.0.99")))
				must(t, ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: vsKey("10.96.0.99", 80), Scheduler: "rr"}))
				// On the node address, in the node-port range: owned.
				must(t, ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: vsKey("192.168.1.10", 31999), Scheduler: "rr"}))
				// On the node address, outside the range: not ours.
				must(t, ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: vsKey("192.168.1.10", 8080), Scheduler: "rr"}))
				// Bound but excluded: never ours.
				must(t, links.AddAddress("ipvs-proxy0", netip.MustParseAddr("10.200.0.7")))
				must(t, ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: vsKey("10.200.0.7", 80), Scheduler: "rr"}))
			},
			want: map[string][]string{"10.96.0.99:80/TCP": {driftUnwantedVS}, "192.168.1.10:31999/TCP": {driftUnwantedVS},
				"address 10.96.0.99": {driftUnwantedAddr}},
			other: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := statusObjects()
			ipvs, links := programmed(t, objs)
			tt.mutate(t, ipvs, links)
			rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
			got := map[string][]string{}
			for _, d := range rep.Drift {
				key := d.VirtualServer
				if d.Address != "" {
					key = "address " + d.Address
				}
				got[key] = append(got[key], d.Kind)
			}
			for vs, kinds := range got {
				slices.Sort(kinds)
				got[vs] = kinds
			}
			for vs, kinds := range tt.want {
				slices.Sort(kinds)
				if !slices.Equal(got[vs], kinds) {
					t.Errorf("drift of %s: %v, want %v", vs, got[vs], kinds)
				}
				if strings.HasPrefix(vs, "address ") {
					continue
				}
				if k := findVS(rep, mustKey(vs)); k == nil || !slices.Equal(sorted(k.Drift), kinds) {
					t.Errorf("virtual server %s: drift %v, want %v", vs, k, kinds)
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("drift %v, want %v", got, tt.want)
			}
			if want := max(tt.other, 1); rep.OtherVirtualServers != want {
				t.Errorf("other virtual servers: %d, want %d", rep.OtherVirtualServers, want)
			}
			if tt.check != nil {
				tt.check(t, rep)
			}
			// The table names every drift.
			var b bytes.Buffer
			if err := Write(&b, rep, "table"); err != nil {
				t.Fatal(err)
			}
			for _, d := range rep.Drift {
				if !strings.Contains(b.String(), d.Kind+" "+d.VirtualServer) {
					t.Errorf("the table lacks %s %s:\n%s", d.Kind, d.VirtualServer, b.String())
				}
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func mustKey(s string) ktypes.VSKey {
	ap := netip.MustParseAddrPort(strings.TrimSuffix(s, "/TCP"))
	return ktypes.VSKey{Address: ap.Addr(), Protocol: ktypes.TCP, Port: ap.Port()}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestStatusWithoutAPI(t *testing.T) {
	objs := statusObjects()
	ipvs, links := programmed(t, objs)
	failing := k8sfake.NewClientset(objs...)
	failing.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	for _, tt := range []struct {
		name   string
		client kubernetes.Interface
		apiErr error
		want   string
	}{
		{"no configuration", nil, agent.ErrNoAPI, "no Kubernetes configuration"},
		{"a bad kubeconfig", nil, errors.New("load Kubernetes client configuration: no such file"), "no such file"},
		{"the API fails", failing, nil, "list Services: connection refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := collect(t, ipvs, links, tt.client, tt.apiErr)
			if rep.API.Available || rep.DriftKnown || rep.Drift != nil || !strings.Contains(rep.API.Error, tt.want) {
				t.Errorf("api %+v driftKnown %v drift %v; want unavailable (%q), drift unknown", rep.API, rep.DriftKnown, rep.Drift, tt.want)
			}
			// The kernel's view: every owned virtual server, no names.
			if len(rep.VirtualServers) != 4 {
				t.Errorf("%d virtual servers, want the 4 owned ones", len(rep.VirtualServers))
			}
			for _, vs := range rep.VirtualServers {
				if vs.Service != "" || vs.Kind != "" || vs.Wanted || !vs.InKernel || len(vs.RealServers) == 0 {
					t.Errorf("%+v: want the kernel's view with no name", vs)
				}
			}
			var b bytes.Buffer
			if err := Write(&b, rep, "table"); err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{"no API access (", "drift: unknown without API access", "10.96.0.10:80/TCP", "10.0.1.2:8080"} {
				if !strings.Contains(b.String(), w) {
					t.Errorf("the table lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestStatusConflictAndWarnings: status decides a shared virtual server
// as run does, the older Service holding it (then namespace/name), and
// reports the conflict; the kernel programmed by run shows no drift.
// (Before, status gave it to the first Service by name, whatever its age.)
func TestStatusConflictAndWarnings(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name           string
		aAge, bAge     time.Duration
		holder, loser  string
		holderPortName string
	}{
		{name: "same age: by name", holder: "ns/a", loser: "ns/b"},
		{name: "the older one, whatever its name", aAge: time.Minute, holder: "ns/b", loser: "ns/a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := []runtime.Object{
				stService("a", "10.96.0.20", func(s *corev1.Service) {
					s.Spec.ExternalIPs = []string{"10.251.0.1"}
					s.CreationTimestamp = metav1.NewTime(t0.Add(tt.aAge))
				}),
				stService("b", "10.96.0.21", func(s *corev1.Service) {
					s.Spec.ExternalIPs = []string{"10.251.0.1"}
					s.Annotations = map[string]string{scheduler.AnnotationScheduler: "fastest"}
					s.CreationTimestamp = metav1.NewTime(t0.Add(tt.bAge))
				}),
			}
			ipvs, links := programmed(t, objs)
			rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
			if len(rep.Drift) != 0 {
				t.Errorf("drift: %+v", rep.Drift)
			}
			if vs := findVS(rep, vsKey("10.251.0.1", 80)); vs == nil || vs.Service != tt.holder+":http" || vs.Kind != "ExternalIP" {
				t.Errorf("the shared externalIP: %+v, want held by %s", vs, tt.holder)
			}
			wantConflicts := []statusConflict{{VirtualServer: "10.251.0.1:80/TCP", Holder: tt.holder, Loser: tt.loser}}
			if diff := cmp.Diff(wantConflicts, rep.Conflicts); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
			joined := strings.Join(rep.Warnings, "\n")
			for _, w := range []string{tt.loser + ": virtual server 10.251.0.1:80/TCP is held by Service " + tt.holder + ", which is older",
				`ns/b: annotation ipvs-proxy.io/scheduler: unknown IPVS scheduler "fastest"`} {
				if !strings.Contains(joined, w) {
					t.Errorf("warnings %q lack %q", rep.Warnings, w)
				}
			}
		})
	}
}

func TestWriteStatus(t *testing.T) {
	objs := statusObjects()
	ipvs, links := programmed(t, objs)
	must(t, ipvs.DeleteRealServer(vsKey("10.96.0.10", 80), rsKey("10.0.1.1")))
	rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
	next := time.Date(2026, 11, 23, 10, 0, 8, 0, time.UTC)
	rep.Agent = opsserver.AgentStatus{Available: true, Failing: []string{"iptables glue"},
		LastSyncError: "iptables glue: iptables-restore: line 7 failed", Services: []opsserver.ServiceStatus{{Service: "ns/web", Failures: 3,
			LastError: "add-real-server 10.96.0.10:80/TCP 10.0.1.1:8080 w=1: invalid argument", NextRetry: &next}}}
	var b bytes.Buffer
	if err := Write(&b, rep, "table"); err != nil {
		t.Fatal(err)
	}
	want := `node node-1, interface ipvs-proxy0; 3 Services read from the API
SERVICE         KIND        VIRTUAL SERVER          SCHEDULER                     REAL SERVER    WEIGHT  ACTIVE  INACTIVE  DRIFT
ns/np:8000      ClusterIP   10.96.0.11:8000/TCP     rr                            10.0.2.1:8080  1       0       0
ns/np:8000      NodePort    192.168.1.10:30080/TCP  rr                            10.0.2.1:8080  1       0       0
ns/sticky:http  ClusterIP   10.96.0.12:80/TCP       sh persistent,sh-port 10800s  10.0.3.1:8080  1       0       0
ns/sticky:http  ExternalIP  10.200.0.5:80/TCP       sh persistent,sh-port 10800s  10.0.3.1:8080  1       0       0
ns/web:http     ClusterIP   10.96.0.10:80/TCP       rr                            10.0.1.1:8080  1       -       -         missing
                                                                                  10.0.1.2:8080  1       0       0
virtual servers of others (left alone): 1
drift: 1
  missing-real-server 10.96.0.10:80/TCP (ns/web:http): real server 10.0.1.1:8080 w=1 is wanted, not in the kernel
agent: node-wide part failing: iptables glue; last sync's error: iptables glue: iptables-restore: line 7 failed
failing: ns/web (3 attempts, next retry 2026-11-23T10:00:08Z): add-real-server 10.96.0.10:80/TCP 10.0.1.1:8080 w=1: invalid argument
`
	if got := b.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	b.Reset()
	if err := Write(&b, rep, "json"); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"service": "ns/web:http"`, `"kind": "ClusterIP"`, `"activeConns": 0`, `"drift": "missing"`,
		`"kind": "missing-real-server"`, `"driftKnown": true`, `"flags": [`, `"persistenceTimeout": 10800`, `"failures": 3`} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("JSON lacks %s:\n%s", w, b.String())
		}
	}
}

// TestStatusSchedulerFallback: run programs a Service whose scheduler the
// kernel cannot load with the default one; status, knowing the module is
// missing, sees no drift there. (Before, status built the plan with the
// missing scheduler and reported drift that was not there.)
func TestStatusSchedulerFallback(t *testing.T) {
	objs := []runtime.Object{
		stService("hashed", "10.96.0.30", func(s *corev1.Service) {
			s.Annotations = map[string]string{scheduler.AnnotationScheduler: "mh"}
		}), stSlice("hashed", "10.0.4.1"),
	}
	ipvs, links := programmed(t, objs)
	// What run leaves in a kernel without ip_vs_mh: the default scheduler.
	must(t, ipvs.UpdateVirtualServer(ktypes.VirtualServer{VSKey: vsKey("10.96.0.30", 80), Scheduler: "rr"}))
	missing := func(name string) bool { return name == "mh" }
	for _, tt := range []struct {
		name    string
		missing func(string) bool
		drift   []string
	}{
		{name: "module missing: run's fallback is no drift", missing: missing},
		{name: "module present: the kernel should have mh", drift: []string{driftDifferentVS}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Collect(context.Background(), statusConfig(), ipvs, links, kubetest.New(k8sfake.NewClientset(objs...)), nil, tt.missing)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, d := range rep.Drift {
				kinds = append(kinds, d.Kind)
			}
			if diff := cmp.Diff(tt.drift, kinds); diff != "" {
				t.Errorf("drift (-want +got):\n%s\n%+v", diff, rep.Drift)
			}
		})
	}
}
