package model_test

import (
	"math/rand/v2"
	"net/netip"
	stdslices "slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// The real servers of sh, dh and mh virtual servers are kept in one order
// derived from the set alone (ascending from the list's head), whatever
// order the kernel's list is in.
func TestDiffOrdered(t *testing.T) {
	sh, mh, rr := dvs("10.96.0.1:80", "sh"), dvs("10.96.0.1:80", "mh"), dvs("10.96.0.1:80", "rr")
	tests := []struct {
		name string
		want model.Want
		have []string // the kernel's list, head first
		// was is the kernel's scheduler, when not the wanted one.
		was string
		ops []string
	}{{
		name: "a new virtual server's real servers are added last first",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"),
		ops: []string{
			"add-real-server 10.96.0.1:80/TCP 10.0.0.3:8080 w=1 [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=1 [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 [ns/a]",
		},
	}, {
		name: "in canonical order: nothing to do (an agent's restart)",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080", "10.0.0.2:8080"),
		have: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
	}, {
		name: "an endpoint that sorts first costs one add",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"),
		have: []string{"10.0.0.2:8080", "10.0.0.3:8080"},
		ops:  []string{"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 [ns/a]"},
	}, {
		name: "an endpoint in the middle moves those ahead of it",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"),
		have: []string{"10.0.0.1:8080", "10.0.0.3:8080"},
		ops: []string{
			"add-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=1 [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 (move to head) [ns/a]",
		},
	}, {
		name: "the kernel's order of adds (newest first) is reversed",
		want: want("ns/a", model.KindClusterIP, dvs("10.96.0.1:80", "dh"), "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"),
		have: []string{"10.0.0.3:8080", "10.0.0.2:8080", "10.0.0.1:8080"},
		ops: []string{
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=1 (move to head) [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 (move to head) [ns/a]",
		},
	}, {
		name: "a weight changes in place; a moved one takes its new weight",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080@0", "10.0.0.2:8080@0", "10.0.0.3:8080"),
		have: []string{"10.0.0.2:8080", "10.0.0.1:8080", "10.0.0.3:8080"},
		ops: []string{
			"update-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=0 (was w=1) [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=0 (move to head) [ns/a]",
		},
	}, {
		name: "an endpoint that stopped serving or left goes at once, busy or not",
		want: want("ns/a", model.KindClusterIP, sh, "10.0.0.1:8080@d", "10.0.0.2:8080"),
		have: []string{"10.0.0.1:8080#3", "10.0.0.2:8080", "10.0.0.9:8080#5"},
		ops: []string{
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.9:8080 [ns/a]",
		},
	}, {
		name: "mh: a draining real server is added at weight 1, then set to 0, to keep its slots",
		want: want("ns/a", model.KindClusterIP, mh, "10.0.0.1:8080@0", "10.0.0.2:8080"),
		have: []string{"10.0.0.2:8080"},
		ops: []string{
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 [ns/a]",
			"update-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=0 (was w=1) [ns/a]",
		},
	}, {
		name: "changed to mh: a draining real server added at weight 0 (no mh slots) is moved to get them",
		want: want("ns/a", model.KindClusterIP, mh, "10.0.0.1:8080", "10.0.0.2:8080@0"),
		have: []string{"10.0.0.1:8080", "10.0.0.2:8080@0"},
		was:  "rr",
		ops: []string{
			"update-virtual-server 10.96.0.1:80/TCP mh (was 10.96.0.1:80/TCP rr) [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=1 (move to head) [ns/a]",
			"update-real-server 10.96.0.1:80/TCP 10.0.0.2:8080 w=0 (was w=1) [ns/a]",
			"delete-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 (move to head) [ns/a]",
			"add-real-server 10.96.0.1:80/TCP 10.0.0.1:8080 w=1 (move to head) [ns/a]",
		},
	}, {
		name: "rr: the list's order is not looked at, a busy one drains",
		want: want("ns/a", model.KindClusterIP, rr, "10.0.0.1:8080", "10.0.0.2:8080"),
		have: []string{"10.0.0.2:8080", "10.0.0.9:8080#1", "10.0.0.1:8080"},
		ops:  []string{"update-real-server 10.96.0.1:80/TCP 10.0.0.9:8080 w=0 (was w=1) [ns/a]"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var have *model.Kernel
			if tc.have != nil {
				kvsv := tc.want.VirtualServer
				if tc.was != "" {
					kvsv.Scheduler = tc.was
				}
				have = kernel(nil, kvs{kvsv, tc.have})
			} else {
				have = kernel(nil)
			}
			if tc.have != nil && len(tc.have) == 0 {
				t.Fatal("bad case")
			}
			ops := model.Diff(desired(nil, tc.want), have, model.Scope{All: true})
			var got []string
			for _, s := range opStrings(ops) {
				if s != "add-virtual-server 10.96.0.1:80/TCP "+tc.want.Scheduler+" [ns/a]" {
					got = append(got, s)
				}
			}
			if diff := cmp.Diff(tc.ops, got); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
		})
	}
}

// Whatever a node's history (endpoints that came and went in any order,
// draining ones, an agent that restarted with the kernel's list as it
// was), one Diff leaves its list in the order every other node's has.
func TestDiffOrderedConvergesFromAnyHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]string, 12)
	for i := range pool {
		pool[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i % 3), byte(40 - i)}), 8080).String()
	}
	for _, sched := range []string{"sh", "dh", "mh"} {
		vs := dvs("10.96.0.1:80", sched)
		for run := 0; run < 200; run++ {
			var list []ktypes.RealServer // head first
			for step := 0; step < 6; step++ {
				set := randomSet(rng, pool)
				w := want("ns/a", model.KindClusterIP, vs, set...)
				if step == 0 {
					list = randomList(rng, w.RealServers) // any order: a kernel from before
				}
				ops := model.Diff(desired(nil, w), kernel(nil, kvs{vs, listStrings(list)}), model.Scope{All: true})
				list = applyToList(t, list, ops)
				got, wantList := keys(list), canonical(w.RealServers)
				if !stdslices.Equal(got, wantList) {
					t.Fatalf("%s run %d step %d: list %v, want %v", sched, run, step, got, wantList)
				}
				for _, rs := range list {
					if rs.Weight != weightOf(w.RealServers, rs.RSKey) {
						t.Fatalf("%s: %s has weight %d", sched, rs.RSKey, rs.Weight)
					}
				}
			}
		}
	}
}

func randomSet(rng *rand.Rand, pool []string) []string {
	var set []string
	for _, p := range pool {
		switch rng.IntN(4) {
		case 0:
			set = append(set, p+"@0")
		case 1:
			set = append(set, p)
		case 2:
			if rng.IntN(2) == 0 {
				set = append(set, p+"@d")
			}
		}
	}
	stdslices.SortFunc(set, func(a, b string) int { return drs(a).RSKey.Compare(drs(b).RSKey) })
	return set
}

func randomList(rng *rand.Rand, rss []ktypes.RealServer) []ktypes.RealServer {
	var list []ktypes.RealServer
	for _, rs := range rss {
		if rng.IntN(2) == 0 {
			rs.Drain = false
			list = append(list, rs)
		}
	}
	rng.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
	return list
}

func listStrings(list []ktypes.RealServer) []string {
	out := make([]string, len(list))
	for i, rs := range list {
		out[i] = rs.RSKey.String() + "@" + string('0'+rs.Weight)
	}
	return out
}

// applyToList applies a diff's real-server writes as the kernel does: an
// add at the head, an update in place.
func applyToList(t *testing.T, list []ktypes.RealServer, ops []ktypes.Op) []ktypes.RealServer {
	t.Helper()
	for _, op := range ops {
		i := stdslices.IndexFunc(list, func(rs ktypes.RealServer) bool { return rs.RSKey == op.RealServer.RSKey })
		switch op.Kind {
		case ktypes.OpAddRealServer:
			if i >= 0 {
				t.Fatalf("%s: exists", op)
			}
			list = stdslices.Insert(list, 0, ktypes.RealServer{RSKey: op.RealServer.RSKey, Weight: op.RealServer.Weight})
		case ktypes.OpUpdateRealServer:
			list[i].Weight = op.RealServer.Weight
		case ktypes.OpDeleteRealServer:
			list = stdslices.Delete(list, i, i+1)
		}
	}
	return list
}

func keys(list []ktypes.RealServer) []ktypes.RSKey {
	out := make([]ktypes.RSKey, len(list))
	for i, rs := range list {
		out[i] = rs.RSKey
	}
	return out
}

// canonical is the wanted list: the serving real servers, ascending.
func canonical(rss []ktypes.RealServer) []ktypes.RSKey {
	var out []ktypes.RSKey
	for _, rs := range rss {
		if !rs.Drain {
			out = append(out, rs.RSKey)
		}
	}
	return out
}

func weightOf(rss []ktypes.RealServer, k ktypes.RSKey) int32 {
	for _, rs := range rss {
		if rs.RSKey == k {
			return rs.Weight
		}
	}
	return -1
}
