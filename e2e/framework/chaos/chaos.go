// Package chaos records the figures of the reliability suite (`make
// chaos`): each case writes one Row, as <case>.json, into a directory, and
// Table prints every row of that directory as Markdown. It also compares a
// kernel's proxy state with the expected one (Compare), so that every case
// counts leaks the same way, and summarizes a soak's memory readings
// (Summarize: first, last, peak, least-squares slope per node).
package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
)

// Row is one case's figures.
type Row struct {
	// Case names the case (also the file name: <Case>.json).
	Case string `json:"case"`
	// TrafficAttempted and TrafficFailed count the connections (TCP) and
	// exchanges (UDP) the live traffic made during the case, and the
	// held connections, one each.
	TrafficAttempted int `json:"traffic_attempted"`
	TrafficFailed    int `json:"traffic_failed"`
	// KernelWrites is what the case's event cost the agent in netlink
	// writes (IPVS and addresses), as its sync log lines say.
	KernelWrites int `json:"kernel_writes"`
	// ConvergeSeconds is the time from the event's end to a kernel equal
	// to the expected state.
	ConvergeSeconds float64 `json:"converge_seconds"`
	// Leaks counts virtual servers, real servers, addresses and set
	// entries present that should not be (Diff.Leaks).
	Leaks int `json:"leaks"`
	// AgentPeakMiB is the highest peak resident memory (VmHWM) of an
	// agent process over the case, on any node; 0 when not read (rows of
	// runs before it was, cases that do not read it). The notes say each
	// node's.
	AgentPeakMiB float64 `json:"agent_peak_mib,omitempty"`
	// Notes: anything else worth a reader's eye, short.
	Notes string `json:"notes"`
}

// DirEnv names the environment variable of the rows' directory.
const DirEnv = "CHAOS_OUT"

// Dir is $CHAOS_OUT, else bin/chaos at the repository's root (the bin/
// of the Makefile; tests run in their package's directory).
func Dir() string {
	if d := os.Getenv(DirEnv); d != "" {
		return d
	}
	root, err := repo.Root()
	if err != nil {
		return filepath.Join("bin", "chaos")
	}
	return filepath.Join(root, "bin", "chaos")
}

var caseName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Write stores r as dir/<r.Case>.json, replacing an older row of the case.
func Write(dir string, r Row) error {
	if !caseName.MatchString(r.Case) {
		return fmt.Errorf("chaos: bad case name %q", r.Case)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("chaos: encode row %s: %w", r.Case, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, r.Case+".json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("chaos: write row %s: %w", r.Case, err)
	}
	return nil
}

// Record writes r into dir (Dir() when empty) and logs it; a failure to
// write fails the test.
func Record(t testing.TB, dir string, r Row) {
	t.Helper()
	if dir == "" {
		dir = Dir()
	}
	if err := Write(dir, r); err != nil {
		t.Error(err)
		return
	}
	t.Logf("chaos row %s: attempted %d, failed %d, writes %d, converged in %.1f s, leaks %d, agent peak RSS %s MiB; %s",
		r.Case, r.TrafficAttempted, r.TrafficFailed, r.KernelWrites, r.ConvergeSeconds, r.Leaks, peakCell(r.AgentPeakMiB), r.Notes)
}

// Read returns every row of dir (files *.json), sorted by case.
func Read(dir string) ([]Row, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	var rows []Row
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		var r Row
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("chaos: %s: %w", f, err)
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Case < rows[j].Case })
	return rows, nil
}

// Table renders rows as a Markdown table.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| case | traffic attempted | traffic failed | kernel writes | converge (s) | leaks | agent peak RSS (MiB) | notes |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		notes := strings.NewReplacer("|", `\|`, "\n", " ").Replace(r.Notes)
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.1f | %d | %s | %s |\n", r.Case, r.TrafficAttempted, r.TrafficFailed,
			r.KernelWrites, r.ConvergeSeconds, r.Leaks, peakCell(r.AgentPeakMiB), notes)
	}
	return b.String()
}

// peakCell is a row's agent peak in MiB, "-" when it was not read.
func peakCell(mib float64) string {
	if mib <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", mib)
}
