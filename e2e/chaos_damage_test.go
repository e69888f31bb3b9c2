package e2e

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
)

// damageState is what a repair must restore: the kernel state of
// kernelState (another tool's virtual servers included) and ipvs-proxy's
// iptables rules.
type damageState struct {
	kernel chaos.State
	rules  []string
}

func (c chaosEnv) damageState(t *testing.T) damageState {
	t.Helper()
	return damageState{kernel: c.kernelState(t), rules: ownRules(c.iptablesSave(t, "iptables-save"))}
}

// dropRulesUsing returns a shell script that deletes every rule of an
// iptables-save output that matches the set.
func dropRulesUsing(save, set string) string {
	var b strings.Builder
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, "-A ") && strings.Contains(l, "--match-set "+set+" "):
			fmt.Fprintf(&b, "iptables -t %s -D %s\n", table, l[3:])
		}
	}
	return b.String()
}

// TestChaosManualDamage: CHAOS_SIZE Services, traffic, and another tool's
// virtual server. Someone flushes the whole IPVS table (and puts the other
// tool's virtual server back), unbinds the live Service's clusterIP,
// deletes the proxy's dummy interface, and destroys an ipset (after the
// rules that use it): each time the next resync restores exactly what was
// there (the unbinding and the deletion sooner: the kernel announces them,
// and the next sync repairs them; the time is printed),
// the other tool's virtual server is left alone, nothing leaks. New
// connections fail between a damage and its repair: counted, not asserted.
func TestChaosManualDamage(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	n := chaosSize(t)
	ns, live, _ := c.scaled(t, n)
	exp := c.expected(t, ns)
	// chaosSetup put another tool's virtual server in; let a resync pass
	// with it in place.
	time.Sleep(6 * time.Second)
	want := c.damageState(t)
	if _, ok := want.kernel.Virtual["TCP "+foreignVS]; !ok {
		t.Fatalf("the foreign virtual server %s is gone after a resync", foreignVS)
	}

	lt := c.startLiveTraffic(t, live, 0)
	mark := c.logMark()
	damages := []struct {
		name string
		do   func()
	}{
		{"ipvsadm -C", func() {
			c.vmRun(t, "ipvsadm", "-C")
			c.vmRun(t, "sh", "-c", addForeignVS) // the other tool puts its own back
		}},
		{"ip route del local " + bedRoutedRanges()[0].String(), func() {
			c.vmRun(t, "ip", "route", "del", "local", bedRoutedRanges()[0].String(), "dev", proxyIface, "table", "local")
		}},
		{"ip link del " + proxyIface, func() { c.vmRun(t, "ip", "link", "del", proxyIface) }},
		{"ipset destroy IPVSP-SERVICE", func() {
			// A set that rules use cannot be destroyed: its rules go first.
			c.vmRun(t, "sh", "-c", dropRulesUsing(c.iptablesSave(t, "iptables-save"), "IPVSP-SERVICE")+"ipset destroy IPVSP-SERVICE")
		}},
	}
	var notes []string
	var worst time.Duration
	for _, dm := range damages {
		start := time.Now()
		dm.do()
		name := dm.name
		var got damageState
		for {
			got = c.damageState(t)
			if reflect.DeepEqual(got, want) {
				break
			}
			if time.Since(start) > 2*time.Minute {
				t.Errorf("%s: not repaired after 2 minutes: %s; rules %q, want %q", name, chaos.Compare(got.kernel, exp), got.rules, want.rules)
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		took := time.Since(start)
		worst = max(worst, took)
		t.Logf("%s: repaired in %v", name, took.Round(time.Millisecond))
		notes = append(notes, fmt.Sprintf("%s: %.1f s", name, seconds(took)))
	}
	d := chaos.Compare(c.kernelState(t), exp)
	if len(d.Leaks) > 0 {
		t.Errorf("leaks: %s", d)
	}
	// Traffic after the last repair: it flows again (and a flow whose
	// attempts waited out their timeouts during the damage gets its
	// attempts; on a quiet machine the damage lasts only seconds).
	time.Sleep(5 * time.Second)
	attempted, failed, errs := lt.stop(t)
	t.Logf("%d of %d connections failed while the damage lasted: %q", failed, attempted, errs)
	peaks.record(t, chaos.Row{Case: "manual-damage", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: syncWrites(c.logSince(mark)), ConvergeSeconds: seconds(worst), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d Services, resync every 5 s; repaired: %s; foreign %s kept; connections fail until each repair",
			n+1, strings.Join(notes, ", "), foreignVS)})
}
