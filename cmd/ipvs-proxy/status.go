package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Kinds of drift between what the Services want and what the kernel holds.
const (
	driftMissingVS   = "missing-virtual-server"   // wanted, not in the kernel
	driftUnwantedVS  = "unwanted-virtual-server"  // owned, in the kernel, wanted by no Service
	driftDifferentVS = "different-virtual-server" // scheduler, flags or persistence differ
	driftMissingRS   = "missing-real-server"
	driftExtraRS     = "extra-real-server"
	driftWeight      = "different-weight"
)

// statusRealServer is one real server of a virtual server.
type statusRealServer struct {
	Address       string `json:"address"`
	Port          uint16 `json:"port"`
	Weight        int    `json:"weight"`
	ActiveConns   int    `json:"activeConns"`
	InactiveConns int    `json:"inactiveConns"`
	// InKernel is false for a wanted real server the kernel lacks.
	InKernel bool `json:"inKernel"`
	// Drift is "", or missing, extra or weight; WantWeight is the wanted
	// weight for missing and weight (0 is a draining real server).
	Drift      string `json:"drift,omitempty"`
	WantWeight *int   `json:"wantWeight,omitempty"`

	key netlinkutil.RSKey
}

func newStatusRS(rs netlinkutil.RealServer, inKernel bool) statusRealServer {
	return statusRealServer{Address: rs.Address.String(), Port: rs.Port, Weight: rs.Weight,
		ActiveConns: rs.ActiveConns, InactiveConns: rs.InactiveConns, InKernel: inKernel, key: rs.RSKey}
}

// statusVirtualServer is one owned or wanted virtual server.
type statusVirtualServer struct {
	// Service is namespace/name:port ("" when unknown).
	Service     string `json:"service,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	ServicePort string `json:"servicePort,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Address     string `json:"address"`
	Protocol    string `json:"protocol"`
	Port        uint16 `json:"port"`
	// Scheduler, Flags and PersistenceTimeout are the kernel's, or the
	// wanted ones when the kernel lacks the virtual server.
	Scheduler          string             `json:"scheduler"`
	Flags              []string           `json:"flags,omitempty"`
	PersistenceTimeout uint32             `json:"persistenceTimeout,omitempty"`
	InKernel           bool               `json:"inKernel"`
	Wanted             bool               `json:"wanted"`
	RealServers        []statusRealServer `json:"realServers"`
	// Drift lists the kinds of drift of this virtual server.
	Drift []string `json:"drift,omitempty"`

	key netlinkutil.VSKey
}

// statusDrift is one difference between the wanted and the kernel state.
type statusDrift struct {
	Kind          string `json:"kind"`
	VirtualServer string `json:"virtualServer"`
	Service       string `json:"service,omitempty"`
	Detail        string `json:"detail"`
}

// statusAPI tells whether Kubernetes names could be read.
type statusAPI struct {
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
	Services  int    `json:"services"`
}

// statusReport is what `ipvs-proxy status` prints.
type statusReport struct {
	Node      string    `json:"node"`
	Interface string    `json:"interface"`
	API       statusAPI `json:"api"`
	// DriftKnown is false without API access: nothing is known to be wanted.
	DriftKnown     bool                  `json:"driftKnown"`
	VirtualServers []statusVirtualServer `json:"virtualServers"`
	Drift          []statusDrift         `json:"drift"`
	// OtherVirtualServers counts the kernel's virtual servers that
	// ipvs-proxy does not own (and leaves alone).
	OtherVirtualServers int      `json:"otherVirtualServers"`
	Warnings            []string `json:"warnings,omitempty"`
}

func newStatusCommand() *cobra.Command {
	var of *optionFlags
	var output string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the virtual servers ipvs-proxy owns, by Service, and any drift from what the Services want",
		Long: `Show what the kernel holds for ipvs-proxy: every virtual server it owns (by
the same rule as run), with its Service (namespace/name:port), kind, scheduler
and real servers (weights, active and inactive connections), and the drift
between what the Services want (computed as run computes it, from the API) and
the kernel. Without API access it shows the kernel's view with no names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, cfg, _, err := of.resolveReport(output)
			if err != nil {
				return err
			}
			ipvs, err := netlinkutil.NewIPVS()
			if err != nil {
				return fmt.Errorf("read the kernel: %w", err)
			}
			defer ipvs.Close()
			links, err := netlinkutil.NewLinks()
			if err != nil {
				return fmt.Errorf("read the kernel: %w", err)
			}
			var client kubernetes.Interface
			var apiErr error
			if o.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
				apiErr = errNoAPI
			} else {
				client, apiErr = kubeClient(o.Kubeconfig)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := collectStatus(ctx, cfg, ipvs, links, client, apiErr)
			if err != nil {
				return err
			}
			return writeStatus(cmd.OutOrStdout(), rep, output)
		},
	}
	of = newOptionFlags(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "table", "Output format: table or json.")
	cmd.Flags().DurationVar(&timeout, "api-timeout", 30*time.Second, "Time allowed for reading Services and EndpointSlices from the API.")
	return cmd
}

// wantedVS is a virtual server that a Service's plan asks for.
type wantedVS struct {
	plan    proxier.VSPlan
	service types.NamespacedName
	port    string // the Service port's name, or its number when unnamed
}

// desiredState lists the Services and EndpointSlices and builds their
// plans as run does. It returns the wanted virtual servers and the number
// of Services read.
func desiredState(ctx context.Context, client kubernetes.Interface, cfg proxier.Config, nodeAddrs []netip.Addr) (map[netlinkutil.VSKey]wantedVS, int, []string, error) {
	services, err := listServices(ctx, client)
	if err != nil {
		return nil, 0, nil, err
	}
	slicesOf := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	opts := metav1.ListOptions{LabelSelector: serviceSelector, Limit: 500}
	for {
		list, err := client.DiscoveryV1().EndpointSlices("").List(ctx, opts)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("list EndpointSlices: %w", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
				n := types.NamespacedName{Namespace: s.Namespace, Name: svc}
				slicesOf[n] = append(slicesOf[n], s)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	var warnings []string
	zone := ""
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()})
	if err != nil {
		warnings = append(warnings, fmt.Sprintf("cannot read Node %s (its zone shapes topology-aware routing): %v", cfg.NodeName, err))
	} else {
		for _, n := range nodes.Items {
			if n.Name == cfg.NodeName {
				zone = n.Labels[corev1.LabelTopologyZone]
			}
		}
	}

	node := proxier.NodeInfo{Name: cfg.NodeName, Zone: zone, NodePortAddresses: proxier.FilterNodePortAddresses(nodeAddrs, cfg.NodePortAddresses)}
	bcfg := proxier.BuildConfig{Scheduler: cfg.Scheduler, IPv4: cfg.IPv4, IPv6: cfg.IPv6, ExcludeCIDRs: cfg.ExcludeCIDRs}
	// On a full sync the reconciler applies Services in the order of their
	// "namespace/name", so the first one that wants a virtual server holds it.
	slices.SortFunc(services, func(a, b corev1.Service) int {
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	want := map[netlinkutil.VSKey]wantedVS{}
	n := 0
	for i := range services {
		svc := &services[i]
		if proxier.Skip(svc) {
			continue
		}
		n++
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		plan := proxier.Build(svc, slicesOf[name], node, bcfg)
		for _, w := range plan.Warnings {
			warnings = append(warnings, name.String()+": "+w)
		}
		for _, vs := range plan.VirtualServers {
			if old, taken := want[vs.VSKey]; taken {
				warnings = append(warnings, fmt.Sprintf("%s: virtual server %s is also wanted by %s, which holds it", name, vs.VSKey, old.service))
				continue
			}
			want[vs.VSKey] = wantedVS{plan: vs, service: name, port: servicePortLabel(svc, vs.PortName)}
		}
	}
	return want, n, warnings, nil
}

// servicePortLabel names a Service port: its name, or its number when the
// Service has a single unnamed port.
func servicePortLabel(svc *corev1.Service, portName string) string {
	if portName != "" {
		return portName
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == "" {
			return strconv.Itoa(int(p.Port))
		}
	}
	return "?"
}

// owns is the reconciler's rule: a virtual server is ipvs-proxy's when
// proxier.Ownership says so or when a Service wants it.
func owns(own proxier.Ownership, bound, node map[netip.Addr]bool, k netlinkutil.VSKey, wanted bool) bool {
	return own.Owns(k, bound[k.Address], node[k.Address]) || wanted
}

// collectStatus reads the kernel and, with a client, the Services, and
// joins them. apiErr, when set, is why there is no client.
func collectStatus(ctx context.Context, cfg proxier.Config, ipvs netlinkutil.IPVS, links netlinkutil.Links,
	client kubernetes.Interface, apiErr error) (statusReport, error) {
	rep := statusReport{Node: cfg.NodeName, Interface: cfg.Interface, VirtualServers: []statusVirtualServer{}}
	own := proxier.Ownership{Interface: cfg.Interface, NodePortRange: cfg.NodePortRange, ExcludeCIDRs: cfg.ExcludeCIDRs}

	boundList, err := links.ListAddresses(cfg.Interface)
	if err != nil {
		return rep, fmt.Errorf("read the kernel: %w", err)
	}
	bound := map[netip.Addr]bool{}
	for _, a := range boundList {
		if !a.IsLinkLocalUnicast() { // the kernel's own, not ipvs-proxy's
			bound[a] = true
		}
	}
	nodeAddrs, err := links.NodeAddresses(cfg.Interface)
	if err != nil {
		return rep, fmt.Errorf("read the kernel: %w", err)
	}
	node := map[netip.Addr]bool{}
	for _, a := range nodeAddrs {
		node[a] = true
	}
	kernel, err := ipvs.ListVirtualServers()
	if err != nil {
		return rep, fmt.Errorf("read the kernel: %w", err)
	}

	var want map[netlinkutil.VSKey]wantedVS
	if apiErr == nil && client != nil {
		var n int
		want, n, rep.Warnings, apiErr = desiredState(ctx, client, cfg, nodeAddrs)
		rep.API.Services = n
	} else if apiErr == nil {
		apiErr = errNoAPI
	}
	if apiErr != nil {
		want = nil
		rep.API.Error = apiErr.Error()
	} else {
		rep.API.Available, rep.DriftKnown = true, true
		rep.Drift = []statusDrift{}
	}

	byKey := map[netlinkutil.VSKey]*statusVirtualServer{}
	for _, vs := range kernel {
		w, wanted := want[vs.VSKey]
		if !owns(own, bound, node, vs.VSKey, wanted) {
			rep.OtherVirtualServers++
			continue
		}
		s := newStatusVS(vs.VSKey, vs)
		s.InKernel = true
		rss, err := ipvs.ListRealServers(vs.VSKey)
		if err != nil {
			return rep, fmt.Errorf("read the kernel: %w", err)
		}
		slices.SortFunc(rss, func(a, b netlinkutil.RealServer) int { return a.RSKey.Compare(b.RSKey) })
		for _, rs := range rss {
			s.RealServers = append(s.RealServers, newStatusRS(rs, true))
		}
		if wanted {
			s.name(w)
			s.Wanted = true
			rep.diff(s, vs, w.plan)
		} else if rep.DriftKnown {
			rep.drift(s, driftUnwantedVS, "owned by ipvs-proxy and wanted by no Service (run deletes it on its next full sync)")
		}
		byKey[vs.VSKey] = s
	}
	for k, w := range want {
		if _, ok := byKey[k]; ok {
			continue
		}
		s := newStatusVS(k, w.plan.VirtualServer)
		s.name(w)
		s.Wanted = true
		for _, rs := range w.plan.RealServers {
			m := newStatusRS(rs, false)
			m.Drift, m.WantWeight = "missing", &rs.Weight
			s.RealServers = append(s.RealServers, m)
		}
		rep.drift(s, driftMissingVS, "wanted, not in the kernel: "+w.plan.VirtualServer.String())
		byKey[k] = s
	}
	for _, s := range byKey {
		rep.VirtualServers = append(rep.VirtualServers, *s)
	}
	slices.SortFunc(rep.VirtualServers, func(a, b statusVirtualServer) int {
		// Named first, by Service; then by address, protocol, port.
		unnamed := func(v statusVirtualServer) int {
			if v.Service == "" {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(unnamed(a), unnamed(b)), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name), a.key.Compare(b.key))
	})
	slices.SortStableFunc(rep.Drift, func(a, b statusDrift) int {
		return cmp.Compare(a.VirtualServer, b.VirtualServer)
	})
	return rep, nil
}

func newStatusVS(k netlinkutil.VSKey, vs netlinkutil.VirtualServer) *statusVirtualServer {
	s := &statusVirtualServer{Address: k.Address.String(), Protocol: k.Protocol.String(), Port: k.Port,
		Scheduler: vs.Scheduler, Flags: flagNames(vs), RealServers: []statusRealServer{}, key: k}
	if vs.Flags&netlinkutil.FlagPersistent != 0 {
		s.PersistenceTimeout = vs.Timeout
	}
	return s
}

func (s *statusVirtualServer) name(w wantedVS) {
	s.Namespace, s.Name, s.ServicePort = w.service.Namespace, w.service.Name, w.port
	s.Service = w.service.String() + ":" + w.port
	s.Kind = string(w.plan.Kind)
}

// flagNames names a virtual server's flags: persistent, one-packet, and the
// scheduler's own flags (sh-port, ...).
func flagNames(vs netlinkutil.VirtualServer) []string {
	var out []string
	f := vs.Flags & netlinkutil.FlagsCompared
	if f&netlinkutil.FlagPersistent != 0 {
		out = append(out, "persistent")
	}
	if f&netlinkutil.FlagOnePacket != 0 {
		out = append(out, "one-packet")
	}
	rest := f &^ (netlinkutil.FlagPersistent | netlinkutil.FlagOnePacket)
	for _, name := range []string{"sh-fallback", "sh-port", "mh-fallback", "mh-port"} {
		if bits, err := scheduler.ParseFlags(vs.Scheduler, name); err == nil && rest&bits != 0 {
			out = append(out, name)
			rest &^= bits
		}
	}
	if rest != 0 {
		out = append(out, fmt.Sprintf("flags-%#x", rest))
	}
	return out
}

func (r *statusReport) drift(s *statusVirtualServer, kind, detail string) {
	s.Drift = append(s.Drift, kind)
	r.Drift = append(r.Drift, statusDrift{Kind: kind, VirtualServer: s.key.String(), Service: s.Service, Detail: detail})
}

// diff records the drift between a virtual server in the kernel (with its
// real servers already in s) and what its Service wants.
func (r *statusReport) diff(s *statusVirtualServer, have netlinkutil.VirtualServer, want proxier.VSPlan) {
	if !have.Equal(want.VirtualServer) {
		r.drift(s, driftDifferentVS, fmt.Sprintf("kernel has %s, wanted %s", have, want.VirtualServer))
	}
	wanted := map[netlinkutil.RSKey]netlinkutil.RealServer{}
	for _, rs := range want.RealServers {
		wanted[rs.RSKey] = rs
	}
	seen := map[netlinkutil.RSKey]bool{}
	for i := range s.RealServers {
		rs := &s.RealServers[i]
		k := rs.key
		seen[k] = true
		w, ok := wanted[k]
		switch {
		case !ok:
			rs.Drift = "extra"
			r.drift(s, driftExtraRS, fmt.Sprintf("real server %s w=%d is in the kernel, not wanted", k, rs.Weight))
		case w.Weight != rs.Weight:
			rs.Drift, rs.WantWeight = "weight", &w.Weight
			r.drift(s, driftWeight, fmt.Sprintf("real server %s has weight %d, wanted %d", k, rs.Weight, w.Weight))
		}
	}
	for _, w := range want.RealServers {
		if seen[w.RSKey] {
			continue
		}
		m := newStatusRS(w, false)
		m.Drift, m.WantWeight = "missing", &w.Weight
		s.RealServers = append(s.RealServers, m)
		r.drift(s, driftMissingRS, fmt.Sprintf("real server %s w=%d is wanted, not in the kernel", w.RSKey, w.Weight))
	}
	slices.SortFunc(s.RealServers, func(a, b statusRealServer) int { return a.key.Compare(b.key) })
	s.Drift = slices.Compact(s.Drift)
}

// writeStatus prints the report as a table or JSON.
func writeStatus(w io.Writer, rep statusReport, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write the status: %w", err)
		}
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node %s, interface %s; ", rep.Node, rep.Interface)
	if rep.API.Available {
		fmt.Fprintf(&b, "%d Services read from the API\n", rep.API.Services)
	} else {
		fmt.Fprintf(&b, "no API access (%s): names and drift unknown\n", rep.API.Error)
	}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tKIND\tVIRTUAL SERVER\tSCHEDULER\tREAL SERVER\tWEIGHT\tACTIVE\tINACTIVE\tDRIFT")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, vs := range rep.VirtualServers {
		sched := vs.Scheduler
		if len(vs.Flags) > 0 {
			sched += " " + strings.Join(vs.Flags, ",")
		}
		if vs.PersistenceTimeout > 0 {
			sched += fmt.Sprintf(" %ds", vs.PersistenceTimeout)
		}
		first := fmt.Sprintf("%s\t%s\t%s\t%s\t", dash(vs.Service), dash(vs.Kind), vs.key, sched)
		vsDrift := strings.Join(slices.DeleteFunc(slices.Clone(vs.Drift), func(d string) bool {
			return d == driftMissingRS || d == driftExtraRS || d == driftWeight
		}), ",")
		if len(vs.RealServers) == 0 {
			fmt.Fprintf(tw, "%s-\t\t\t\t%s\n", first, vsDrift)
			continue
		}
		for i, rs := range vs.RealServers {
			prefix := "\t\t\t\t"
			if i == 0 {
				prefix = first
			}
			d := rs.Drift
			if i == 0 && vsDrift != "" {
				d = strings.Trim(vsDrift+","+d, ",")
			}
			active, inactive := strconv.Itoa(rs.ActiveConns), strconv.Itoa(rs.InactiveConns)
			if !rs.InKernel {
				active, inactive = "-", "-"
			}
			weight := strconv.Itoa(rs.Weight)
			if rs.Drift == "weight" && rs.WantWeight != nil {
				weight += fmt.Sprintf(" (want %d)", *rs.WantWeight)
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\n", prefix, rs.key, weight, active, inactive, d)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the status: %w", err)
	}
	for _, line := range strings.SplitAfter(table.String(), "\n") {
		b.WriteString(strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			b.WriteString("\n")
		}
	}
	if len(rep.VirtualServers) == 0 {
		b.WriteString("(no virtual servers owned by ipvs-proxy)\n")
	}
	if rep.OtherVirtualServers > 0 {
		fmt.Fprintf(&b, "virtual servers of others (left alone): %d\n", rep.OtherVirtualServers)
	}
	switch {
	case !rep.DriftKnown:
		b.WriteString("drift: unknown without API access\n")
	case len(rep.Drift) == 0:
		b.WriteString("drift: none\n")
	default:
		fmt.Fprintf(&b, "drift: %d\n", len(rep.Drift))
		for _, d := range rep.Drift {
			svc := ""
			if d.Service != "" {
				svc = " (" + d.Service + ")"
			}
			fmt.Fprintf(&b, "  %s %s%s: %s\n", d.Kind, d.VirtualServer, svc, d.Detail)
		}
	}
	for _, w := range rep.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write the status: %w", err)
	}
	return nil
}
