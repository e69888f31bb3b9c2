package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// changeFlags are the flags of latency and burst.
type changeFlags struct {
	kubeconfig, namespace string
	timeout               time.Duration
	dataplane             dataplaneFlags
}

func (c *changeFlags) register(fs *flag.FlagSet) {
	c.dataplane.register(fs, false)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig of the apiserver")
	fs.StringVar(&c.namespace, "namespace", "", "namespace of the EndpointSlices")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "how long one change may take to reach the kernel")
}

// open makes an apiserver client (not throttled) and opens the dataplane.
func (c *changeFlags) open() (kubernetes.Interface, dataplane, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	d, err := c.dataplane.open()
	return cs, d, err
}

// change is one EndpointSlice's first endpoint moved to a neighbour
// address (the last bit flipped: two moves bring it back, and it never
// meets the slice's other endpoint), and where the kernel shows it.
type change struct {
	slice    *discoveryv1.EndpointSlice
	vs       netip.AddrPort
	old, new netip.Addr
}

func prepare(ctx context.Context, cs kubernetes.Interface, ns, name string, vs netip.AddrPort) (change, error) {
	eps, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return change{}, fmt.Errorf("get slice %s: %w", name, err)
	}
	if len(eps.Endpoints) == 0 || len(eps.Endpoints[0].Addresses) == 0 {
		return change{}, fmt.Errorf("slice %s/%s has no endpoint to change", ns, name)
	}
	old, err := netip.ParseAddr(eps.Endpoints[0].Addresses[0])
	if err != nil {
		return change{}, err
	}
	b := old.As4()
	b[3] ^= 1
	c := change{slice: eps, vs: vs, old: old, new: netip.AddrFrom4(b)}
	c.slice.Endpoints[0].Addresses[0] = c.new.String()
	return c, nil
}

func (c change) apply(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := cs.DiscoveryV1().EndpointSlices(c.slice.Namespace).Update(ctx, c.slice, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update slice %s: %w", c.slice.Name, err)
	}
	return nil
}

// landed reports whether the kernel has the change: new connections go
// to the new endpoint and not to the old one (endpoints: dataplane's).
func (c change) landed(endpoints func(netip.AddrPort) ([]netip.Addr, error)) (bool, error) {
	eps, err := endpoints(c.vs)
	if err != nil {
		return false, err
	}
	return slices.Contains(eps, c.new) && !slices.Contains(eps, c.old), nil
}

// latency times single changes of one EndpointSlice, each from its update
// through the apiserver until the kernel has it (destination dumps of the
// virtual server, at most 1% apart of the time so far). With -during-sync-of it waits, before
// each change, for that process to go quiet and then start working again
// (its periodic sync), and makes the change right then, or -sync-delay later.
func latency(args []string) error {
	fs := flag.NewFlagSet("latency", flag.ContinueOnError)
	var cf changeFlags
	cf.register(fs)
	name := fs.String("slice", "", "the EndpointSlice to change")
	vsArg := fs.String("vs", "", "its virtual server, VIP:PORT")
	rounds := fs.Int("rounds", 5, "changes to time")
	duringSync := fs.String("during-sync-of", "", "make each change once this process's periodic sync has begun")
	syncCPU := fs.Duration("sync-cpu", 150*time.Millisecond, "with -during-sync-of: CPU used after a quiet period that means a sync began")
	syncQuiet := fs.Duration("sync-quiet", time.Second, "with -during-sync-of: the quiet period before a sync")
	syncWait := fs.Duration("sync-wait", 5*time.Minute, "with -during-sync-of: how long to wait for a sync to begin")
	syncDelay := fs.Duration("sync-delay", 0, "with -during-sync-of: how long after the sync began to make the change")
	if err := fs.Parse(args); err != nil {
		return err
	}
	vs, err := netip.ParseAddrPort(*vsArg)
	if err != nil {
		return fmt.Errorf("virtual server %q: %w", *vsArg, err)
	}
	cs, k, err := cf.open()
	if err != nil {
		return err
	}
	defer k.Close()
	ctx := context.Background()
	var out struct {
		Seconds []float64 `json:"seconds"`
		// Waited: how long each round waited for a sync to begin; At:
		// when each change was made (Unix seconds, this VM's clock).
		Waited []float64 `json:"waited,omitempty"`
		At     []float64 `json:"at"`
		// Poll: how long the read that saw each change took (the
		// figure's resolution: a run of nft under emulation is slow).
		Poll []float64 `json:"poll"`
	}
	for i := 0; i < *rounds; i++ {
		c, err := prepare(ctx, cs, cf.namespace, *name, vs)
		if err != nil {
			return err
		}
		if *duringSync != "" {
			waited, err := awaitSync(*duringSync, *syncQuiet, *syncCPU, *syncWait)
			if err != nil {
				return err
			}
			out.Waited = append(out.Waited, waited.Seconds())
			time.Sleep(*syncDelay)
		}
		start := time.Now()
		if err := c.apply(ctx, cs); err != nil {
			return err
		}
		for {
			t0 := time.Now()
			ok, err := c.landed(k.endpoints)
			if err != nil {
				return err
			}
			if ok {
				out.Poll = append(out.Poll, time.Since(t0).Seconds())
				break
			}
			if time.Since(start) > cf.timeout {
				return fmt.Errorf("round %d: the change not in the kernel after %v", i, cf.timeout)
			}
			time.Sleep(pollInterval(time.Since(start)))
		}
		out.Seconds = append(out.Seconds, time.Since(start).Seconds())
		out.At = append(out.At, float64(start.UnixNano())/1e9)
		time.Sleep(300 * time.Millisecond) // let the proxy settle between rounds
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// errNoSync: the process was never quiet and then busy again.
var errNoSync = errors.New("no quiet period followed by a sync")

// awaitSync waits for the process named comm to be quiet (less than 20 ms
// of CPU time in quiet) and then to use cpu of CPU time (sampled every
// 10 ms): a sync that began on its own (or some other work: the caller
// checks).
func awaitSync(comm string, quiet, cpu, timeout time.Duration) (time.Duration, error) {
	pid, _, err := findProc(comm, 10*time.Second)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	log := cpuLog{pid: pid}
	var base time.Duration = -1
	for ; time.Since(start) < timeout; time.Sleep(10 * time.Millisecond) {
		s, err := log.sample()
		if err != nil {
			return 0, err
		}
		if base < 0 {
			if _, ok := log.idleSince(quiet, 20*time.Millisecond); ok {
				base = s.total()
			}
			continue
		}
		if s.total()-base >= cpu {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("%s: %w in %v", comm, errNoSync, timeout)
}

// burst changes many EndpointSlices at once (every update in flight
// together, as a rollout's controllers would) and times from the first
// update until the kernel has the last change.
func burst(args []string) error {
	fs := flag.NewFlagSet("burst", flag.ContinueOnError)
	var cf changeFlags
	cf.register(fs)
	specFile := fs.String("changes", "", `JSON file: [{"slice":NAME,"vs":VIP:PORT},...]`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	data, err := os.ReadFile(*specFile)
	if err != nil {
		return err
	}
	var spec []struct {
		Slice string `json:"slice"`
		VS    string `json:"vs"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("parse %s: %w", *specFile, err)
	}
	cs, k, err := cf.open()
	if err != nil {
		return err
	}
	defer k.Close()
	ctx := context.Background()
	changes := make([]change, len(spec))
	for i, s := range spec {
		vs, err := netip.ParseAddrPort(s.VS)
		if err != nil {
			return fmt.Errorf("virtual server %q: %w", s.VS, err)
		}
		if changes[i], err = prepare(ctx, cs, cf.namespace, s.Slice, vs); err != nil {
			return err
		}
	}
	start := time.Now()
	errs := make([]error, len(changes))
	var wg sync.WaitGroup
	for i, c := range changes {
		wg.Go(func() { errs[i] = c.apply(ctx, cs) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	issued := time.Since(start)
	pending := changes
	for len(pending) > 0 {
		var still []change
		look, err := k.reader()
		if err != nil {
			return err
		}
		for _, c := range pending {
			ok, err := c.landed(look)
			if err != nil {
				return err
			}
			if !ok {
				still = append(still, c)
			}
		}
		pending = still
		if len(pending) > 0 {
			if time.Since(start) > cf.timeout {
				return fmt.Errorf("%d of %d changes not in the kernel after %v", len(pending), len(changes), cf.timeout)
			}
			time.Sleep(pollInterval(time.Since(start)))
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]float64{"seconds": time.Since(start).Seconds(), "issued": issued.Seconds()})
}

// pollInterval keeps the kernel's polling within 1% of the time waited so
// far (1 ms at first, 50 ms at most): a slow proxy is not slowed further.
func pollInterval(waited time.Duration) time.Duration {
	return min(max(waited/100, time.Millisecond), 50*time.Millisecond)
}
