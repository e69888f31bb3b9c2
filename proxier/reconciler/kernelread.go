package reconciler

// The view of the kernel: its reads, and the ownership rule applied to
// them.

import (
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// readRealServers reads the destinations of the virtual servers in scope
// that are wanted and in the kernel. It returns the reads that failed.
// Many of them (bulkReads) are read at once, by the one read of the whole
// table a full sync makes, rather than by a dump each: a node address
// change at 300 Services took 805 dumps, 23 s of a loaded VM.
func (r *Reconciler) readRealServers(st *SyncStats, keys []ktypes.VSKey, want model.Desired) map[ktypes.VSKey]error {
	var need []ktypes.VSKey
	for _, k := range keys {
		if _, wanted := want.VirtualServers[k]; !wanted {
			continue
		}
		if _, ok := r.kernel.VirtualServers[k]; !ok {
			continue
		}
		if _, read := r.kernel.RealServers[k]; read { // by a full sync's bulk read
			continue
		}
		need = append(need, k)
	}
	if r.bulkReads(len(need)) {
		need = r.readRealServersAtOnce(st, need)
	}
	failed := map[ktypes.VSKey]error{}
	for _, k := range need {
		st.Reads++
		rss, err := r.ipvs.ListRealServers(k)
		if err != nil {
			failed[k] = fmt.Errorf("read real servers of %s: %w", k, err)
			continue
		}
		r.kernel.RealServers[k] = rss
	}
	return failed
}

// bulkReadMin is the fewest virtual servers whose real servers a sync
// reads at once (readRealServersAtOnce); below it, a dump each is cheaper
// than parsing the table.
const bulkReadMin = 64

// bulkReads tells whether n virtual servers' real servers are read at
// once: at least bulkReadMin, and an eighth of the virtual servers known
// (a dump costs a round trip, a table line a parse: at 10,000 Services,
// one change's few dumps stay cheaper than the table's 30,000 lines).
func (r *Reconciler) bulkReads(n int) bool {
	return n >= bulkReadMin && n*8 >= len(r.kernel.VirtualServers)
}

// readRealServersAtOnce reads the real servers of every virtual server in
// one read (IPVS.ListAllRealServers) and keeps those of keys; it returns
// the keys still to read one by one: those the read did not hold (added
// or removed since the view was taken), or all of them if it failed.
func (r *Reconciler) readRealServersAtOnce(st *SyncStats, keys []ktypes.VSKey) []ktypes.VSKey {
	st.Reads++
	all, err := r.ipvs.ListAllRealServers()
	if err != nil {
		r.log.Warn("read every IPVS real server at once; reading them one virtual server at a time",
			zap.Int("virtualServers", len(keys)), zap.Error(err))
		return keys
	}
	var left []ktypes.VSKey
	for _, k := range keys {
		rss, ok := all[k]
		if !ok {
			left = append(left, k)
			continue
		}
		r.kernel.RealServers[k] = rss
	}
	return left
}

// ours tells, for a new read of the kernel, the virtual servers that are
// the agent's beyond the ownership rule: those a Service wants, and those
// the current view holds (the agent made or adopted them). A virtual
// server on a node address outside the node-port range (an externalIP
// equal to the node's address) is owned by nothing else: without the
// second part, a read after its Service went would forget it, and it
// would never be deleted.
func (r *Reconciler) ours(k ktypes.VSKey) bool {
	if r.claims.wanted(k) {
		return true
	}
	_, known := r.kernel.VirtualServers[k]
	return known
}

// readKernel replaces the view of the kernel with one dump of virtual
// servers and one of the interface's addresses.
func (r *Reconciler) readKernel(st *SyncStats) error {
	if err := r.links.EnsureDummy(r.own.Interface); err != nil {
		return fmt.Errorf("ensure interface %s: %w", r.own.Interface, err)
	}
	k, _, reads, err := ReadKernel(r.ipvs, r.links, r.own, r.ours)
	st.Reads += reads
	if err != nil {
		return err
	}
	// The real servers of every virtual server in one read; one that
	// appeared since the dump is read alone by readRealServers.
	st.Reads++
	all, err := r.ipvs.ListAllRealServers()
	if err != nil {
		return fmt.Errorf("read IPVS real servers: %w", err)
	}
	for key := range k.VirtualServers {
		if rss, ok := all[key]; ok {
			k.RealServers[key] = rss
		}
	}
	k.Reserve(r.claims.vsCount) // an empty kernel: the sync writes what the plans want
	r.kernel = k
	return nil
}

// ReadKernel reads the part of the kernel that the ownership rule gives
// ipvs-proxy, by one dump of the virtual servers and of the addresses of
// its interface (and of the one it adopts): the owned virtual servers and
// the addresses bound to its interface. wanted tells the virtual servers
// that a Service wants, which are owned wherever they are. It returns the
// view, the number of virtual servers left to others and the reads made.
// Real servers are not read. The reconciler and `ipvs-proxy status` read
// the kernel through it, so they own the same things.
func ReadKernel(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership, wanted func(ktypes.VSKey) bool) (*model.Kernel, int, int, error) {
	raw, reads, err := readRaw(ipvs, links, own)
	if err != nil {
		return nil, 0, reads, err
	}
	k, foreign := raw.view(own, wanted)
	return k, foreign, reads, nil
}

// rawKernel is what ReadKernel reads, before the ownership rule picks
// from it.
type rawKernel struct {
	vss                  []ktypes.VirtualServer
	bound, adopted, node []netip.Addr
	routes               []netip.Prefix // Service ranges routed through the interface
	// kubeProxy: the addresses on kube-proxy's interface when it is not
	// adopted and a range is routed. A virtual server in a routed range
	// on one of them is kube-proxy's, left for a takeover or `cleanup
	// --kube-proxy`.
	kubeProxy []netip.Addr
}

// readRaw makes ReadKernel's reads. It uses no state of a Reconciler, so
// that a periodic resync can make them off the loop.
func readRaw(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership) (rawKernel, int, error) {
	var raw rawKernel
	reads := 0
	addresses := func(link string) ([]netip.Addr, error) {
		reads++
		all, err := links.ListAddresses(link)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", link, err)
		}
		// The kernel's own link-local address of the interface is not ours.
		return slices.DeleteFunc(all, func(a netip.Addr) bool { return a.IsLinkLocalUnicast() }), nil
	}
	var err error
	if raw.bound, err = addresses(own.Interface); err != nil {
		return raw, reads, err
	}
	reads++
	routes, err := links.ListLocalRoutes(own.Interface)
	if err != nil {
		return raw, reads, fmt.Errorf("list local routes of %s: %w", own.Interface, err)
	}
	for _, r := range routes {
		raw.routes = append(raw.routes, r.Prefix)
	}
	if own.Adopt != "" {
		if raw.adopted, err = addresses(own.Adopt); err != nil {
			return raw, reads, err
		}
	} else if len(raw.routes) > 0 && own.Interface != netlinkutil.KubeProxyInterface {
		if raw.kubeProxy, err = addresses(netlinkutil.KubeProxyInterface); err != nil {
			return raw, reads, err
		}
	}
	reads++
	if raw.node, err = links.NodeAddresses(netlinkutil.ProxyInterfaces(own.Interface)...); err != nil {
		return raw, reads, fmt.Errorf("list node addresses: %w", err)
	}
	reads++
	if raw.vss, err = ipvs.ListVirtualServers(); err != nil {
		return raw, reads, fmt.Errorf("list IPVS services: %w", err)
	}
	return raw, reads, nil
}

// view applies the ownership rule to what readRaw read: the owned virtual
// servers (and those wanted) and the addresses bound to the interface, and
// the number of virtual servers left to others.
func (raw rawKernel) view(own model.Ownership, wanted func(ktypes.VSKey) bool) (*model.Kernel, int) {
	k, others := raw.ownedView(own)
	skipped := 0
	for _, vs := range others {
		if wanted(vs.VSKey) {
			k.PutVirtualServer(vs)
		} else {
			skipped++
		}
	}
	return k, skipped
}

// ownedView is the view of the kernel under the ownership rule alone, and
// the virtual servers the rule leaves to others, which the loop's own
// state may still claim (view). It touches nothing of the reconciler's:
// a read off the loop makes it there.
func (raw rawKernel) ownedView(own model.Ownership) (*model.Kernel, []ktypes.VirtualServer) {
	owned := map[netip.Addr]bool{}
	for _, a := range raw.bound {
		owned[a] = true
	}
	for _, a := range raw.adopted {
		owned[a] = true // owned, though not (yet) on our interface
	}
	node := map[netip.Addr]bool{}
	for _, a := range raw.node {
		node[a] = true
	}
	elsewhere := map[netip.Addr]bool{}
	for _, a := range raw.kubeProxy {
		elsewhere[a] = true
	}
	// An address of a routed range is ours unless it is configured on
	// another interface: one of the node's (its virtual servers are ours
	// as node ports only) or kube-proxy's dummy (they are kube-proxy's).
	routed := func(a netip.Addr) bool { return model.InRanges(raw.routes, a) && !node[a] && !elsewhere[a] }
	mine := make([]ktypes.VirtualServer, 0, len(raw.vss))
	var others []ktypes.VirtualServer
	for _, vs := range raw.vss {
		if own.Owns(vs.VSKey, owned[vs.Address] || routed(vs.Address), node[vs.Address]) {
			mine = append(mine, vs)
		} else {
			others = append(others, vs)
		}
	}
	// Bound addresses in --exclude-cidrs are read as any other: Diff
	// never unbinds them (Desired.Excluded).
	k := model.NewKernel(mine, raw.bound)
	for _, p := range raw.routes {
		k.Routes[p] = true
	}
	return k, others
}
