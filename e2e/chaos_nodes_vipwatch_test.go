package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// watchedVIP is a UDP virtual server that vipWatch follows: its Service
// (namespace, name) and its address.
type watchedVIP struct {
	ns, name string
	vs       ktypes.VSKey
}

// vipSample is what vipWatch read at once (host clock): each Service's
// ready endpoints, and each node's real servers of its virtual server.
type vipSample struct {
	at    time.Time
	ready map[string][]netip.Addr            // by Service name
	ipvs  map[string]map[string][]netip.Addr // by node, then Service name
}

// vipWatch samples, every 2 s until stopped, the EndpointSlices of some
// Services and both nodes' real servers of their virtual servers: which
// of the cluster (no ready endpoint) or the agent (its node's IPVS not
// yet as the slice says) a lost query met.
type vipWatch struct {
	b       *nodesBed
	vips    []watchedVIP
	mu      sync.Mutex
	samples []vipSample
	done    chan struct{}
	wg      sync.WaitGroup
}

func (b *nodesBed) watchVIPs(vips ...watchedVIP) *vipWatch {
	w := &vipWatch{b: b, vips: vips, done: make(chan struct{})}
	w.wg.Add(1)
	go w.run()
	return w
}

func (w *vipWatch) run() {
	defer w.wg.Done()
	for {
		if s, err := w.sample(); err == nil {
			w.mu.Lock()
			w.samples = append(w.samples, s)
			w.mu.Unlock()
		}
		select {
		case <-w.done:
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// sample reads the slices and the nodes' tables once; its time is the
// middle of the reads.
func (w *vipWatch) sample() (vipSample, error) {
	began := time.Now()
	s := vipSample{ready: map[string][]netip.Addr{}, ipvs: map[string]map[string][]netip.Addr{}}
	for _, v := range w.vips {
		ready, err := readyAddrs(w.b.ctx, w.b, v.ns, v.name)
		if err != nil {
			return s, err
		}
		s.ready[v.name] = ready
	}
	for _, n := range w.b.c.Nodes {
		table, err := readIPVSTable(w.b.ctx, n.VM)
		if err != nil {
			return s, err
		}
		s.ipvs[n.Name] = map[string][]netip.Addr{}
		for _, v := range w.vips {
			var rss []netip.Addr
			for _, rs := range table[v.vs] {
				rss = append(rss, rs.Address)
			}
			slices.SortFunc(rss, netip.Addr.Compare)
			s.ipvs[n.Name][v.name] = rss
		}
	}
	s.at = began.Add(time.Since(began) / 2)
	return s, nil
}

// readyAddrs are the ready addresses of the EndpointSlices of Service
// ns/name, sorted.
func readyAddrs(ctx context.Context, b *nodesBed, ns, name string) ([]netip.Addr, error) {
	list, err := b.fast.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, fmt.Errorf("endpointslices of %s/%s: %w", ns, name, err)
	}
	var out []netip.Addr
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if ptr.Deref(e.Conditions.Ready, false) {
				out = append(out, netip.MustParseAddr(e.Addresses[0]))
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// stop ends the watch and logs each Service's timeline: every change of
// its ready endpoints or of a node's real servers, and the longest time
// a node's IPVS differed from the slice (fails the test beyond udpBound:
// the agent's lag, whatever the load).
func (w *vipWatch) stop(t *testing.T) {
	t.Helper()
	close(w.done)
	w.wg.Wait()
	t.Logf("VIP watch: %d samples", len(w.samples))
	for _, v := range w.vips {
		last := ""
		behindSince := map[string]time.Time{}
		longest := map[string]time.Duration{}
		for _, s := range w.samples {
			state := fmt.Sprintf("slice %v", s.ready[v.name])
			for _, n := range w.b.c.Nodes {
				state += fmt.Sprintf(", %s %v", n.Name, s.ipvs[n.Name][v.name])
				if slices.Equal(s.ipvs[n.Name][v.name], s.ready[v.name]) || len(s.ready[v.name]) == 0 {
					delete(behindSince, n.Name)
					continue
				}
				if behindSince[n.Name].IsZero() {
					behindSince[n.Name] = s.at
				}
				longest[n.Name] = max(longest[n.Name], s.at.Sub(behindSince[n.Name]))
			}
			if state != last {
				t.Logf("VIP watch %s/%s at %s: %s", v.ns, v.name, s.at.Format("15:04:05.0"), state)
				last = state
			}
		}
		for n, d := range longest {
			t.Logf("VIP watch %s/%s: %s's IPVS differed from the slice for %s at the longest", v.ns, v.name, n, round(d))
			if d > udpBound {
				t.Errorf("%s's IPVS differed from the EndpointSlice of %s/%s for %s; want within %s", n, v.ns, v.name, round(d), udpBound)
			}
		}
	}
}

// cause is what a query to Service svc from node, lost at at (host
// clock), met: "unready" (no ready endpoint), "behind" (node's IPVS not
// as the slice says) or "" (the kernel as the slice), by the sample
// nearest to 1 s after at (the query waits up to 5 s).
func (w *vipWatch) cause(at time.Time, node, svc string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	mid := at.Add(time.Second)
	best := -1
	for i, s := range w.samples {
		if best < 0 || s.at.Sub(mid).Abs() < w.samples[best].at.Sub(mid).Abs() {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	s := w.samples[best]
	switch {
	case len(s.ready[svc]) == 0:
		return "unready"
	case !slices.Equal(s.ipvs[node][svc], s.ready[svc]):
		return "behind"
	}
	return ""
}

// String is the watch's figures for the row's notes.
func (w *vipWatch) String() string {
	names := make([]string, len(w.vips))
	for i, v := range w.vips {
		names[i] = v.ns + "/" + v.name
	}
	return fmt.Sprintf("%d samples of %s", len(w.samples), strings.Join(names, ", "))
}

// TestVIPWatchCause: a lost query is charged by the sample nearest to a
// second after it: no ready endpoint, the node's IPVS not as the slice
// (the other node's state does not count), or the kernel as the slice.
func TestVIPWatchCause(t *testing.T) {
	a, b := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.6")
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	sample := func(sec int, ready, n1, n2 []netip.Addr) vipSample {
		return vipSample{at: t0.Add(time.Duration(sec) * time.Second), ready: map[string][]netip.Addr{"udp-echo": ready},
			ipvs: map[string]map[string][]netip.Addr{"node-1": {"udp-echo": n1}, "node-2": {"udp-echo": n2}}}
	}
	w := &vipWatch{samples: []vipSample{
		sample(0, []netip.Addr{a}, []netip.Addr{a}, []netip.Addr{a}),
		sample(10, []netip.Addr{b}, []netip.Addr{a, b}, []netip.Addr{b}), // node-1 behind
		sample(20, nil, nil, nil),                                        // no ready endpoint
		sample(30, []netip.Addr{b}, []netip.Addr{b}, []netip.Addr{b}),
	}}
	for _, tc := range []struct {
		at         int
		node, want string
	}{
		{0, "node-1", ""}, {9, "node-1", "behind"}, {9, "node-2", ""}, {18, "node-2", "unready"}, {40, "node-1", ""},
	} {
		if got := w.cause(t0.Add(time.Duration(tc.at)*time.Second), tc.node, "udp-echo"); got != tc.want {
			t.Errorf("a query from %s lost at +%ds: cause %q; want %q", tc.node, tc.at, got, tc.want)
		}
	}
	if got := (&vipWatch{}).cause(t0, "node-1", "udp-echo"); got != "" {
		t.Errorf("no sample: cause %q; want none", got)
	}
}
