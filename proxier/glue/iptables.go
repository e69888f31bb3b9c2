package glue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
)

// Runner runs the iptables tools. Exec is the real one; tests use a fake.
type Runner interface {
	// Run runs name with args and stdin and returns its stdout; a non-zero
	// exit is an error that carries stderr.
	Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error)
	// LookPath reports whether the tool exists.
	LookPath(name string) error
}

// Exec runs the tools from PATH.
type Exec struct{}

// Run implements Runner.
func (Exec) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// LookPath implements Runner.
func (Exec) LookPath(name string) error {
	_, err := exec.LookPath(name)
	return err
}

// Backend is an iptables backend.
type Backend string

// Backends.
const (
	NFT    Backend = "nft"
	Legacy Backend = "legacy"
)

// toolTimeout bounds one run of iptables-save or iptables-restore.
const toolTimeout = time.Minute

// IPTables runs the save and restore tools of one backend and family.
type IPTables struct {
	Runner  Runner
	Backend Backend
	Family  ipset.Family
	// save and restore are the tools' names, e.g. "iptables-nft-save".
	save, restore string
}

// NewIPTables returns the tools of a backend and family. Unsuffixed tools
// ("iptables-save") are used when the suffixed ones are missing and
// `iptables --version` names the backend.
func NewIPTables(r Runner, b Backend, f ipset.Family) (*IPTables, error) {
	base := "iptables"
	if f == ipset.IPv6 {
		base = "ip6tables"
	}
	t := &IPTables{Runner: r, Backend: b, Family: f}
	t.save, t.restore = base+"-"+string(b)+"-save", base+"-"+string(b)+"-restore"
	if r.LookPath(t.save) == nil && r.LookPath(t.restore) == nil {
		return t, nil
	}
	if unsuffixedBackend(r, base) == b {
		t.save, t.restore = base+"-save", base+"-restore"
		return t, nil
	}
	return nil, fmt.Errorf("%s: no %s backend tools (%s, %s) on PATH", base, b, t.save, t.restore)
}

// unsuffixedBackend asks `iptables --version` which backend the
// unsuffixed tools use ("iptables v1.8.9 (nf_tables)"); "" if unknown.
func unsuffixedBackend(r Runner, base string) Backend {
	if r.LookPath(base) != nil || r.LookPath(base+"-save") != nil || r.LookPath(base+"-restore") != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	out, err := r.Run(ctx, base, []string{"--version"}, nil)
	if err != nil {
		return ""
	}
	switch {
	case strings.Contains(string(out), "nf_tables"):
		return NFT
	case strings.Contains(string(out), "legacy"):
		return Legacy
	}
	return ""
}

// String names the tools, e.g. "iptables (nft)".
func (t *IPTables) String() string {
	base := "iptables"
	if t.Family == ipset.IPv6 {
		base = "ip6tables"
	}
	return fmt.Sprintf("%s (%s)", base, t.Backend)
}

// Save returns the parsed state of every table.
func (t *IPTables) Save(ctx context.Context) (Saved, error) {
	return t.SaveWithin(ctx, toolTimeout)
}

// SaveWithin is Save with limit in place of toolTimeout.
func (t *IPTables) SaveWithin(ctx context.Context, limit time.Duration) (Saved, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	out, err := t.Runner.Run(ctx, t.save, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s rules: %w", t, err)
	}
	return ParseSave(string(out)), nil
}

// Restore applies a restore input without flushing what it does not name:
// each table of the input is one transaction.
func (t *IPTables) Restore(ctx context.Context, input string) error {
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	args := []string{"--noflush"}
	if t.Backend == Legacy {
		args = append(args, "--wait", "5") // the legacy backend's xtables lock
	}
	if _, err := t.Runner.Run(ctx, t.restore, args, []byte(input)); err != nil {
		return fmt.Errorf("apply %s rules: %w", t, err)
	}
	return nil
}

// DetectBackend picks the backend whose tables hold the node's existing
// rules (the one with more rules; nft on a tie, as Debian and most
// distributions default to it). want "nft" or "legacy" overrides it.
// reason explains the choice for the log.
func DetectBackend(r Runner, want string) (b Backend, reason string, err error) {
	switch want {
	case string(NFT), string(Legacy):
		return Backend(want), "--iptables-backend " + want, nil
	case "", "auto":
	default:
		return "", "", fmt.Errorf("--iptables-backend: %q is not auto, nft or legacy", want)
	}
	counts := map[Backend]int{}
	var available []Backend
	var errs []error
	for _, cand := range []Backend{NFT, Legacy} {
		t, err := NewIPTables(r, cand, ipset.IPv4)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		saved, err := t.Save(context.Background())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		available = append(available, cand)
		counts[cand] = saved.RuleCount()
	}
	switch len(available) {
	case 0:
		return "", "", fmt.Errorf("no usable iptables (install iptables; nft or legacy): %w", errors.Join(errs...))
	case 1:
		return available[0], fmt.Sprintf("only %s is available (%d rules)", available[0], counts[available[0]]), nil
	}
	if counts[Legacy] > counts[NFT] {
		return Legacy, fmt.Sprintf("legacy holds %d rules, nft %d", counts[Legacy], counts[NFT]), nil
	}
	return NFT, fmt.Sprintf("nft holds %d rules, legacy %d", counts[NFT], counts[Legacy]), nil
}

// Saved is the parsed output of iptables-save, by table.
type Saved map[string]*SavedTable

// SavedTable is one table of iptables-save's output.
type SavedTable struct {
	// Chains in order of appearance.
	Chains []string
	// Rules maps a chain to its "-A CHAIN ..." lines, in order.
	Rules map[string][]string
	// Policies maps a built-in chain to its policy (ACCEPT, DROP).
	Policies map[string]string
}

// ParseSave parses iptables-save output.
func ParseSave(out string) Saved {
	s := Saved{}
	var cur *SavedTable
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &SavedTable{Rules: map[string][]string{}, Policies: map[string]string{}}
			s[line[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			name, rest, _ := strings.Cut(line[1:], " ")
			cur.Chains = append(cur.Chains, name)
			if policy, _, _ := strings.Cut(rest, " "); policy != "-" && policy != "" {
				cur.Policies[name] = policy
			}
		case strings.HasPrefix(line, "-A "):
			chain, _, _ := strings.Cut(line[3:], " ")
			cur.Rules[chain] = append(cur.Rules[chain], line)
		}
	}
	return s
}

// RuleCount is the number of rules in every table.
func (s Saved) RuleCount() int {
	n := 0
	for _, t := range s {
		for _, r := range t.Rules {
			n += len(r)
		}
	}
	return n
}

// Owned reports whether a chain is ipvs-proxy's (in any table).
func Owned(_, chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }

// builtin chains of the tables ipvs-proxy uses or may have used.
var builtin = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// jumpTarget returns the chain a rule jumps to ("" if none).
func jumpTarget(rule string) string {
	i := strings.LastIndex(rule, " -j ")
	if i < 0 {
		i = strings.LastIndex(rule, " -g ")
	}
	if i < 0 {
		return ""
	}
	target, _, _ := strings.Cut(rule[i+4:], " ")
	return target
}

// ChainOwner decides which chains of a table a restore may delete, and so
// which jumps in built-in chains it may remove (those to such a chain).
type ChainOwner func(table, chain string) bool

// RestoreInput computes the iptables-restore --noflush input that turns the
// saved state into the wanted tables, touching only chains that owns
// accepts and jumps to them from built-in chains. Tables of saved that hold
// owned chains but are not wanted are cleaned. It is "" when nothing
// differs: the rules already in the kernel are exactly the wanted ones.
// want's rules must be written as iptables-save prints them.
func RestoreInput(want []Table, saved Saved, owns ChainOwner) string {
	var b strings.Builder
	names := map[string]bool{}
	for _, t := range want {
		names[t.Name] = true
		b.WriteString(restoreTable(t, saved[t.Name], owns))
	}
	var others []string
	for name := range saved {
		if !names[name] {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	for _, name := range others {
		b.WriteString(restoreTable(Table{Name: name}, saved[name], owns))
	}
	return b.String()
}

func restoreTable(want Table, have *SavedTable, owns ChainOwner) string {
	if have == nil {
		have = &SavedTable{Rules: map[string][]string{}}
	}
	wantChain := map[string]bool{}
	for _, c := range want.Chains {
		wantChain[c] = true
	}
	wantRules := map[string][]string{}
	for _, r := range want.Rules {
		chain, _, _ := strings.Cut(r[3:], " ")
		wantRules[chain] = append(wantRules[chain], r)
	}

	var stale []string // owned chains not wanted
	upToDate := true
	present := map[string]bool{}
	for _, c := range have.Chains {
		present[c] = true
		if !builtin[c] && owns(want.Name, c) && !wantChain[c] {
			stale = append(stale, c)
			upToDate = false
		}
	}
	for _, c := range want.Chains {
		if !present[c] || !slices.Equal(have.Rules[c], wantRules[c]) {
			upToDate = false
		}
	}

	// Jumps from built-in chains: keep one copy of each wanted one, delete
	// the rest that lead to an owned chain.
	var dels, ins []string
	wantJump := map[string]bool{}
	for _, j := range want.Jumps {
		wantJump["-A "+j.Chain+" "+j.Spec()] = true
	}
	seen := map[string]bool{}
	var chains []string
	for c := range have.Rules {
		if builtin[c] {
			chains = append(chains, c)
		}
	}
	slices.Sort(chains)
	for _, c := range chains {
		for _, r := range have.Rules[c] {
			if t := jumpTarget(r); t == "" || builtin[t] || !owns(want.Name, t) {
				continue
			}
			if wantJump[r] && !seen[r] {
				seen[r] = true
				continue
			}
			dels = append(dels, "-D"+strings.TrimPrefix(r, "-A"))
		}
	}
	for _, j := range want.Jumps {
		if !seen["-A "+j.Chain+" "+j.Spec()] {
			ins = append(ins, "-I "+j.Chain+" 1 "+j.Spec())
		}
	}
	if upToDate && len(dels) == 0 && len(ins) == 0 {
		return ""
	}

	var b strings.Builder
	b.WriteString("*" + want.Name + "\n")
	for _, c := range want.Chains {
		b.WriteString(":" + c + " - [0:0]\n") // created, or flushed
	}
	for _, c := range stale {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, l := range dels {
		b.WriteString(l + "\n")
	}
	for _, l := range ins {
		b.WriteString(l + "\n")
	}
	for _, r := range want.Rules {
		b.WriteString(r + "\n")
	}
	for _, c := range stale {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
