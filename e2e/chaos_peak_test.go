package e2e

// The agents' peak memory over one chaos case (issue 45: each case
// reports the agent's peak memory): each node's agent processes have
// their peak resident set (VmHWM) set back to their present one at the
// case's start, and read at its end.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// agentMemScript prints, for each ipvs-proxy process that runs the agent
// (`run` among its arguments; not `cleanup`, `status` or a preflight), its
// PID and VmHWM and VmRSS in kB. With RESET=1 it first writes 5 into the
// process's clear_refs, which sets VmHWM back to VmRSS (proc(5)).
const agentMemScript = `for p in $(pidof ipvs-proxy ipvs-proxy-faultinject); do
  case " $(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null) " in *" run "*) ;; *) continue ;; esac
  if [ "$RESET" = 1 ]; then echo 5 >/proc/$p/clear_refs || echo "reset-failed $p"; fi
  echo "$p $(awk '/^VmHWM:/{h=$2} /^VmRSS:/{r=$2} END{print h, r}' /proc/$p/status)"
done`

// agentMem is one agent process's memory, as agentMemScript prints it.
type agentMem struct {
	pid        int
	hwmKB, rss int
}

// parseAgentMem reads agentMemScript's output: the processes, and an
// error for a line it cannot read (no processes then) or a peak it could
// not reset (the processes still).
func parseAgentMem(out string) ([]agentMem, error) {
	var procs []agentMem
	var unreset []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "reset-failed" {
			unreset = append(unreset, f[1:]...)
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("agent memory line %q: want PID, VmHWM and VmRSS", line)
		}
		var n [3]int
		for i := range f {
			v, err := strconv.Atoi(f[i])
			if err != nil {
				return nil, fmt.Errorf("agent memory line %q: %w", line, err)
			}
			n[i] = v
		}
		procs = append(procs, agentMem{pid: n[0], hwmKB: n[1], rss: n[2]})
	}
	if len(unreset) > 0 {
		return procs, fmt.Errorf("the peak of process %s could not be reset (it is the peak since its start)", strings.Join(unreset, ", "))
	}
	return procs, nil
}

// namedVM is a node's VM under its node's name.
type namedVM struct {
	name string
	vm   *vm.VM
}

// peakWatch is one case's reading of the agents' peaks: the processes
// each node had at the start, their peaks reset then.
type peakWatch struct {
	ctx   context.Context
	vms   func() []namedVM // asked again at the end: a rebooted node has a new VM
	began map[string][]agentMem
}

// startPeaks sets back the peak of every agent process on vms; a node
// whose peak could not be reset is logged, and its end reading is then
// the process's peak since its own start.
func startPeaks(ctx context.Context, t *testing.T, vms func() []namedVM) *peakWatch {
	t.Helper()
	p := &peakWatch{ctx: ctx, vms: vms, began: map[string][]agentMem{}}
	for _, n := range vms() {
		procs, err := agentMemOn(ctx, n.vm, true)
		if err != nil {
			t.Logf("%s: the agent's peak memory at the case's start: %v", n.name, err)
		}
		p.began[n.name] = procs
	}
	return p
}

// agentMemOn runs agentMemScript on v.
func agentMemOn(ctx context.Context, v *vm.VM, reset bool) ([]agentMem, error) {
	env := "RESET=0; "
	if reset {
		env = "RESET=1; "
	}
	out, err := v.RunOK(ctx, "sh", "-c", env+agentMemScript)
	if err != nil {
		return nil, fmt.Errorf("read the agent processes' memory: %w: %s", err, out)
	}
	return parseAgentMem(out)
}

// fill reads each node's agents' peaks since the start and puts the
// highest into r, each node's into its notes. A node without an agent
// process, or whose reading failed, is said so in the notes.
func (p *peakWatch) fill(t *testing.T, r *chaos.Row) {
	t.Helper()
	var parts []string
	for _, n := range p.vms() {
		procs, err := agentMemOn(p.ctx, n.vm, false)
		if err != nil {
			t.Logf("%s: the agent's peak memory at the case's end: %v", n.name, err)
		}
		parts = append(parts, n.name+" "+peakNote(procs, p.began[n.name], err))
		for _, m := range procs {
			r.AgentPeakMiB = max(r.AgentPeakMiB, float64(m.hwmKB)/1024)
		}
	}
	r.Notes += "; agent peak RSS over the case: " + strings.Join(parts, ", ")
}

// record is chaos.Record of r with the agents' peaks since the start.
func (p *peakWatch) record(t *testing.T, r chaos.Row) {
	t.Helper()
	p.fill(t, &r)
	chaos.Record(t, "", r)
}

// bedVM is the one-VM bed's node.
func (e env) bedVM() func() []namedVM {
	return func() []namedVM { return []namedVM{{bed.NodeName, e.VM}} }
}

// nodeVMs is the cluster's nodes' VMs, as they are when called.
func nodeVMs(c *cluster.Cluster) func() []namedVM {
	return func() []namedVM {
		var vms []namedVM
		for _, n := range c.Nodes {
			vms = append(vms, namedVM{n.Name, n.VM})
		}
		return vms
	}
}

// peakNote says one node's agents' peaks (MiB) at the end, and which of
// them started during the case (their peak is since their start).
func peakNote(procs, began []agentMem, err error) string {
	if err != nil {
		return "not read"
	}
	if len(procs) == 0 {
		return "no agent process"
	}
	var s []string
	for _, m := range procs {
		note := fmt.Sprintf("%.0f MiB (now %.0f)", float64(m.hwmKB)/1024, float64(m.rss)/1024)
		if !hasPID(began, m.pid) {
			note += " in a process started during the case"
		}
		s = append(s, note)
	}
	return strings.Join(s, " and ")
}

func hasPID(procs []agentMem, pid int) bool {
	for _, m := range procs {
		if m.pid == pid {
			return true
		}
	}
	return false
}

// TestParseAgentMem: the script's lines, a failed reset, a line short of
// a field.
func TestParseAgentMem(t *testing.T) {
	got, err := parseAgentMem("305 90112 61440\n\n1200 51200 51200\n")
	if err != nil || len(got) != 2 || got[0] != (agentMem{pid: 305, hwmKB: 90112, rss: 61440}) || got[1].pid != 1200 {
		t.Errorf("two processes: %+v, %v", got, err)
	}
	if got, err := parseAgentMem(""); err != nil || len(got) != 0 {
		t.Errorf("no process: %+v, %v", got, err)
	}
	if got, err := parseAgentMem("reset-failed 305\n305 90112 61440"); err == nil || !strings.Contains(err.Error(), "305") || len(got) != 1 {
		t.Errorf("a failed reset: %+v, %v", got, err)
	}
	if _, err := parseAgentMem("305 90112"); err == nil {
		t.Error("a line without VmRSS was read")
	}
	note := peakNote([]agentMem{{pid: 305, hwmKB: 90112, rss: 61440}, {pid: 9, hwmKB: 1024, rss: 1024}}, []agentMem{{pid: 305}}, nil)
	if want := "88 MiB (now 60) and 1 MiB (now 1) in a process started during the case"; note != want {
		t.Errorf("note %q, want %q", note, want)
	}
}
