// Package kubeproxy runs upstream kube-proxy in IPVS mode in the bed's VM,
// against the bed's apiserver: the kube-proxy to compare ipvs-proxy with
// and to migrate from. Its binary is built from the wrapper module
// e2e/tools/k8sbin on first use (controlplane.EnsureKubeProxy) and copied into
// the running VM on first Start, so beds that do not run it pay nothing.
//
// kube-proxy and ipvs-proxy's agent must not run at the same time: both
// would program the same Services. Start refuses while the bed's agent
// runs. Stop and Kill leave kube-proxy's kernel state (kube-ipvs0, virtual
// servers, KUBE-* chains and sets) in place, serving, as a node looks
// after kube-proxy is removed; Cleanup removes it.
package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// Where kube-proxy lives and listens inside the VM.
const (
	GuestBinary = "/usr/local/bin/kube-proxy"
	GuestConfig = "/etc/kube-proxy/config.yaml"
	// Interface is kube-proxy's dummy interface for the VIPs.
	Interface = "kube-ipvs0"
	// HealthzURL and MetricsURL are reachable from the VM's root namespace
	// only (kube-proxy's default ports, bound to 127.0.0.1).
	HealthzURL = "http://127.0.0.1:10256/healthz"
	MetricsURL = "http://127.0.0.1:10249/metrics"

	// The proxy modes Options.Mode takes.
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
	// NFTablesTable is the table nftables mode programs, in the ip and
	// ip6 families.
	NFTablesTable = "kube-proxy"
)

// NFTablesModules are the kernel modules nftables mode's rules need
// beyond the bed's boot modules (the VM loads the others at boot; these
// are in its initramfs, loaded by LoadNFTablesModules).
var NFTablesModules = []string{"nft_fib_ipv4", "nft_fib_ipv6", "nft_fib_inet", "nft_numgen",
	"nft_reject_ipv4", "nft_reject_ipv6", "nft_limit"}

// LoadNFTablesModules loads NFTablesModules in the VM.
func LoadNFTablesModules(ctx context.Context, v *vm.VM) error {
	for _, m := range NFTablesModules {
		if _, err := v.RunOK(ctx, "modprobe", m); err != nil {
			return fmt.Errorf("kubeproxy: nftables mode: %w", err)
		}
	}
	return nil
}

// Options configure Start. The zero value runs kube-proxy like the bed's
// agent: the bed's cluster CIDR, node ports on eth0, a change synced
// 100 ms after the last.
type Options struct {
	// Log receives progress (nil: none).
	Log func(format string, args ...any)
	// Mode is kube-proxy's proxy mode: ModeIPVS (the default) or
	// ModeNFTables. SyncPeriod, MinSyncPeriod and Scheduler go to that
	// mode's section of the configuration.
	Mode string
	// ClusterCIDR tells pod traffic from the rest (default
	// bed.ClusterCIDR).
	ClusterCIDR string
	// NodePortAddresses (default bed.NodePortCIDR).
	NodePortAddresses []string
	// SyncPeriod is <mode>.syncPeriod, the resync without changes (default
	// kube-proxy's 30s: each sync execs iptables and ipset several times
	// per family, and under emulation takes 3-10 s, so a shorter period
	// keeps the VM busy); MinSyncPeriod is <mode>.minSyncPeriod (default
	// 100ms). Changes are synced after MinSyncPeriod, whatever SyncPeriod.
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// Scheduler is ipvs.scheduler ("": kube-proxy's default, rr; IPVS
	// mode only).
	Scheduler string
	// Verbosity is kube-proxy's -v (default 2).
	Verbosity int
	// Kubeconfig is kube-proxy's kubeconfig, a path in the VM (default
	// bed.GuestKubecfg); NodeName its hostnameOverride (default
	// bed.NodeName).
	Kubeconfig, NodeName string
	// ConntrackDefaults leaves the conntrack section to kube-proxy's own
	// defaults (table size 32768 per CPU, at least 131072; TCP established
	// 24h, CLOSE_WAIT 1h), as kube-proxy sets them on a node of its own
	// cluster. Without it the section is all zero and kube-proxy leaves the
	// kernel's conntrack settings alone (the one-node bed's VM is shared
	// with other tests).
	ConntrackDefaults bool
	// NoWait makes Start return as soon as kube-proxy is started, without
	// waiting for its first sync (nor restarting it if it dies first): for
	// callers that time the first sync themselves.
	NoWait bool
	// Args are more command-line flags. Next to a config file kube-proxy
	// honours only its logging flags (e.g. --vmodule); settings belong in
	// the configuration, so add them to Options.
	Args []string
}

// KubeProxy is kube-proxy running in the bed's VM.
type KubeProxy struct {
	vm   *vm.VM
	proc *vm.Proc
}

// Start builds kube-proxy if needed, installs it in the VM, writes its
// configuration and starts it as node bed.NodeName with the bed's
// kubeconfig, and waits for its first sync (ctx bounds the whole) unless
// o.NoWait. The bed's agent must be stopped.
func Start(ctx context.Context, b *bed.Bed, o Options) (*KubeProxy, error) {
	if b.AgentRunning() {
		return nil, errors.New("kubeproxy: the bed's agent runs: stop it first (Bed.StopAgent)")
	}
	return StartIn(ctx, b.VM, o)
}

// StartIn is Start in any VM with the bed's tools (e.g. the one-node
// cluster's node, with Options.Kubeconfig and NodeName set): nothing else
// may proxy Services there.
func StartIn(ctx context.Context, v *vm.VM, o Options) (*KubeProxy, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if err := install(ctx, v, o.Log); err != nil {
		return nil, err
	}
	if err := v.WriteFile(ctx, GuestConfig, []byte(o.config()), 0o644); err != nil {
		return nil, err
	}
	verbosity := o.Verbosity
	if verbosity == 0 {
		verbosity = 2
	}
	argv := append([]string{GuestBinary, "--config", GuestConfig, fmt.Sprintf("--v=%d", verbosity)}, o.Args...)
	// kube-proxy v1.36.3 sometimes panics at start-up (a Node event reaches
	// its metaproxier before it is set: nil pointer in OnTopologyChange);
	// in a cluster the kubelet restarts it, and so does this.
	const tries = 3
	for try := 1; ; try++ {
		p, err := v.Start(ctx, argv...)
		if err != nil {
			return nil, err
		}
		k := &KubeProxy{vm: v, proc: p}
		if o.NoWait {
			return k, nil
		}
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = k.waitSynced(wctx)
		cancel()
		if err == nil {
			o.Log("kube-proxy synced %v after its start", time.Since(start).Round(time.Millisecond))
			return k, nil
		}
		exited, _, _ := p.Exited(ctx)
		_ = p.Kill()
		if exited && try < tries && ctx.Err() == nil {
			o.Log("kube-proxy exited before its first sync (%v); starting it again, as a kubelet would:\n%s", err, tail(p.Output(), 3000))
			continue
		}
		return nil, fmt.Errorf("kubeproxy: no first sync: %w\n%s", err, tail(p.Output(), 6000))
	}
}

// Install copies kube-proxy into the VM ahead of its first Start (which
// does it otherwise): what times Start from outside then does not time
// kube-proxy's build or copy.
func Install(ctx context.Context, v *vm.VM, logf func(string, ...any)) error {
	return install(ctx, v, logf)
}

// install copies kube-proxy into the VM unless it is there already (a
// VM's root file system lives as long as the VM).
func install(ctx context.Context, v *vm.VM, logf func(string, ...any)) error {
	if r, err := v.Run(ctx, "test", "-x", GuestBinary); err == nil && r.ExitCode == 0 {
		return nil
	}
	t0 := time.Now()
	dir, err := controlplane.EnsureKubeProxy(ctx, controlplane.CacheDir())
	if err != nil {
		return fmt.Errorf("kubeproxy: %w", err)
	}
	built := time.Since(t0)
	if err := v.CopyFile(ctx, filepath.Join(dir, controlplane.BinKubeProxy), GuestBinary); err != nil {
		return fmt.Errorf("kubeproxy: %w", err)
	}
	logf("kube-proxy built or found in %v, copied into the VM in %v", built.Round(time.Millisecond),
		(time.Since(t0) - built).Round(time.Millisecond))
	return nil
}

// config is the KubeProxyConfiguration. Its conntrack section is all zero
// (kube-proxy then leaves the kernel's conntrack table size and timeouts
// alone), or absent with ConntrackDefaults (kube-proxy's defaults apply).
func (o Options) config() string {
	clusterCIDR := o.ClusterCIDR
	if clusterCIDR == "" {
		clusterCIDR = bed.ClusterCIDR
	}
	nodePorts := o.NodePortAddresses
	if nodePorts == nil {
		nodePorts = []string{bed.NodePortCIDR}
	}
	kubeconfig, nodeName := o.Kubeconfig, o.NodeName
	if kubeconfig == "" {
		kubeconfig = bed.GuestKubecfg
	}
	if nodeName == "" {
		nodeName = bed.NodeName
	}
	syncPeriod, minSyncPeriod := o.SyncPeriod, o.MinSyncPeriod
	if syncPeriod == 0 {
		syncPeriod = 30 * time.Second
	}
	if minSyncPeriod == 0 {
		minSyncPeriod = 100 * time.Millisecond
	}
	quoted := make([]string, len(nodePorts))
	for i, a := range nodePorts {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	mode := o.Mode
	if mode == "" {
		mode = ModeIPVS
	}
	section := fmt.Sprintf("%s:\n  syncPeriod: %s\n  minSyncPeriod: %s\n", mode, syncPeriod, minSyncPeriod)
	if mode == ModeIPVS {
		section += fmt.Sprintf("  scheduler: %q\n", o.Scheduler)
	}
	if !o.ConntrackDefaults {
		section += `conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
clusterCIDR: %q
nodePortAddresses: [%s]
healthzBindAddress: "127.0.0.1:10256"
metricsBindAddress: "127.0.0.1:10249"
%s`, mode, kubeconfig, nodeName, clusterCIDR, strings.Join(quoted, ", "), section)
}

// syncedMetric is set at the end of each successful sync, per IP family.
const syncedMetric = `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="%s"}`

// dualStack is what kube-proxy logs when it runs a proxier per family (in
// the bed it does: the VM has ip6tables).
const dualStack = "kube-proxy running in dual-stack mode"

// waitSynced waits until kube-proxy has completed a sync of each family
// it proxies and /healthz answers 200. (Its first IPv4 sync delays the
// start of IPv6's: tests that began after IPv4's alone would race it.)
func (k *KubeProxy) waitSynced(ctx context.Context) error {
	for {
		exited, code, err := k.proc.Exited(ctx)
		if err != nil {
			return err
		}
		if exited {
			return fmt.Errorf("kube-proxy exited with status %d", code)
		}
		families := []string{"IPv4"}
		if strings.Contains(k.proc.Output(), dualStack) {
			families = append(families, "IPv6")
		}
		last := k.synced(ctx, families)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// synced tells why kube-proxy is not synced for families yet (nil: it is).
func (k *KubeProxy) synced(ctx context.Context, families []string) error {
	m, err := bed.ScrapeMetrics(ctx, k.vm, MetricsURL)
	if err != nil {
		return err
	}
	for _, f := range families {
		if m[fmt.Sprintf(syncedMetric, f)] == 0 {
			return fmt.Errorf("no %s sync yet", f)
		}
	}
	status, body, err := k.vm.HTTPGet(ctx, HealthzURL)
	if err != nil {
		return fmt.Errorf("GET %s: %d %s %w", HealthzURL, status, body, err)
	}
	if status != 200 {
		return fmt.Errorf("GET %s: %d %s", HealthzURL, status, body)
	}
	return nil
}

// WaitNextSync waits until kube-proxy has completed a new sync of every
// family it proxies (its last-sync metric moved on), and returns at once
// then: right after a periodic sync, the next is a sync period away.
// kube-proxy exits on SIGTERM wherever it is, also in the middle of a sync.
func (k *KubeProxy) WaitNextSync(ctx context.Context) error {
	families := []string{"IPv4"}
	if strings.Contains(k.proc.Output(), dualStack) {
		families = append(families, "IPv6")
	}
	first, err := bed.ScrapeMetrics(ctx, k.vm, MetricsURL)
	if err != nil {
		return err
	}
	for {
		m, err := bed.ScrapeMetrics(ctx, k.vm, MetricsURL)
		if err != nil {
			return err
		}
		moved := true
		for _, f := range families {
			key := fmt.Sprintf(syncedMetric, f)
			moved = moved && m[key] > first[key]
		}
		if moved {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeproxy: no new sync of %v: %w", families, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops kube-proxy with SIGTERM (SIGKILL after 5 s). Its kernel state
// stays and goes on serving. Stopping twice is fine.
func (k *KubeProxy) Stop() error { return k.proc.Stop() }

// Kill stops kube-proxy with SIGKILL at once, as a crash would; its kernel
// state stays.
func (k *KubeProxy) Kill() error { return k.proc.Kill() }

// Exited reports whether kube-proxy has ended, and its exit status (-1
// when a signal ended it).
func (k *KubeProxy) Exited(ctx context.Context) (bool, int, error) { return k.proc.Exited(ctx) }

// Output is kube-proxy's log so far (the last few MiB).
func (k *KubeProxy) Output() string { return k.proc.Output() }

// Cleanup removes kube-proxy's IPVS-mode state from the VM with
// `ipvs-proxy cleanup --kube-proxy`: kube-ipvs0 and the virtual servers
// on its addresses, kube-proxy's KUBE-* chains and sets. That also removes
// ipvs-proxy's own state (as `ipvs-proxy cleanup` does), nothing else.
// (Not `kube-proxy --cleanup`: it flushes every virtual server in the
// kernel, other tools' too.) It returns the command's report.
func Cleanup(ctx context.Context, b *bed.Bed) (string, error) {
	return b.VM.RunOK(ctx, bed.GuestBinary, "cleanup", "--kube-proxy")
}

// CleanupNFTables removes nftables mode's tables (NFTablesTable in the ip
// and ip6 families) from the VM, if there, and returns what it removed.
func CleanupNFTables(ctx context.Context, v *vm.VM) ([]string, error) {
	out, err := v.RunOK(ctx, "nft", "list", "tables")
	if err != nil {
		return nil, fmt.Errorf("kubeproxy: %w", err)
	}
	var removed []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l) // table <family> <name>
		if len(f) != 3 || f[0] != "table" || f[2] != NFTablesTable || (f[1] != "ip" && f[1] != "ip6") {
			continue
		}
		if _, err := v.RunOK(ctx, "nft", "delete", "table", f[1], f[2]); err != nil {
			return removed, fmt.Errorf("kubeproxy: %w", err)
		}
		removed = append(removed, f[1]+" "+f[2])
	}
	return removed, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[...]\n" + s[len(s)-n:]
}
