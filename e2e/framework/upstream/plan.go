package upstream

import (
	"bufio"
	_ "embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// focus selects the tests of issue 8: the Services tests of sig-network
// and those of EndpointSlices, the granular Service checks, conntrack and
// the proxy itself. Each is a Go regular expression on a test's full name,
// as Ginkgo's --ginkgo.focus takes it.
var focus = []string{
	`\[sig-network\] Services`,
	`EndpointSlice`,
	`Networking Granular Checks: Services`,
	`Conntrack`,
	`KubeProxy`,
}

//go:embed skips.txt
var skipsText string

// SkipGroup is tests left out for one reason.
type SkipGroup struct {
	Reason string
	// Parts are literal parts of full test names (a tag such as
	// [Feature:LoadBalancer], or a whole name).
	Parts []string
	// BelowNodes, if > 0, applies the group only to clusters of fewer
	// nodes (its reason line starts "[below N nodes] ").
	BelowNodes int
	// Proxy, if set, applies the group only to runs with that proxy (its
	// reason line starts "[with PROXY] ").
	Proxy string
}

// Short is the reason up to its first colon (for table cells).
func (g *SkipGroup) Short() string {
	short, _, _ := strings.Cut(g.Reason, ": ")
	return short
}

// Plan is what a run selects: the focus, the skip list and whether only
// [Conformance] tests run.
type Plan struct {
	focusRE, skipRE *regexp.Regexp
	// narrowRE, if set, keeps only the tests of the focus it matches.
	narrowRE        *regexp.Regexp
	Groups          []SkipGroup
	conformanceOnly bool
}

// parseSkips reads the skip list: "## reason" opens a group, each other
// non-empty line that is not a "#" comment is a literal part of the full
// names of the tests the group leaves out.
func parseSkips(text string) ([]SkipGroup, error) {
	var groups []SkipGroup
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			g := SkipGroup{Reason: strings.TrimSpace(line[3:])}
			// "[with PROXY] " and "[below N nodes] ", in either order.
			for {
				if rest, ok := strings.CutPrefix(g.Reason, "[with "); ok {
					proxy, reason, ok := strings.Cut(rest, "] ")
					if !ok || proxy == "" || strings.ContainsAny(proxy, " []") || g.Proxy != "" {
						return nil, fmt.Errorf("skip list line %d: want \"## [with PROXY] reason\" once: %q", n, line)
					}
					g.Reason, g.Proxy = reason, proxy
					continue
				}
				if rest, ok := strings.CutPrefix(g.Reason, "[below "); ok {
					num, reason, ok := strings.Cut(rest, " nodes] ")
					below, err := strconv.Atoi(num)
					if !ok || err != nil || below < 2 || g.BelowNodes != 0 {
						return nil, fmt.Errorf("skip list line %d: want \"## [below N nodes] reason\" once, with N >= 2: %q", n, line)
					}
					g.Reason, g.BelowNodes = reason, below
					continue
				}
				break
			}
			groups = append(groups, g)
		case line == "" || strings.HasPrefix(line, "#"):
		case len(groups) == 0:
			return nil, fmt.Errorf("skip list line %d: %q before the first \"## reason\"", n, line)
		default:
			g := &groups[len(groups)-1]
			g.Parts = append(g.Parts, line)
		}
	}
	for _, g := range groups {
		if len(g.Parts) == 0 {
			return nil, fmt.Errorf("skip list: group %q names no test", g.Reason)
		}
	}
	return groups, sc.Err()
}

// NewPlan is the plan of the checked-in skip list (skips.txt).
func NewPlan(conformanceOnly bool) (*Plan, error) { return newPlanFrom(skipsText, conformanceOnly) }

// newPlanFrom is newPlan with the skip list's text.
func newPlanFrom(skips string, conformanceOnly bool) (*Plan, error) {
	groups, err := parseSkips(skips)
	if err != nil {
		return nil, err
	}
	p := &Plan{Groups: groups, conformanceOnly: conformanceOnly}
	p.focusRE = regexp.MustCompile(p.focusExpr())
	if err := p.compileSkips(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Plan) compileSkips() error {
	var parts []string
	for _, g := range p.Groups {
		for _, part := range g.Parts {
			parts = append(parts, regexp.QuoteMeta(part))
		}
	}
	var err error
	if p.skipRE, err = regexp.Compile(strings.Join(parts, "|")); err != nil {
		return fmt.Errorf("skip list: %w", err)
	}
	return nil
}

// ForNodes fits the plan to a cluster of n nodes: the groups that apply
// only below n nodes or fewer are no longer skipped.
func (p *Plan) ForNodes(n int) error {
	kept := p.Groups[:0:0]
	for _, g := range p.Groups {
		if g.BelowNodes == 0 || n < g.BelowNodes {
			kept = append(kept, g)
		}
	}
	p.Groups = kept
	return p.compileSkips()
}

// ForProxy fits the plan to a run with the named proxy: the groups that
// apply only to another proxy are no longer skipped.
func (p *Plan) ForProxy(proxy string) error {
	kept := p.Groups[:0:0]
	for _, g := range p.Groups {
		if g.Proxy == "" || g.Proxy == proxy {
			kept = append(kept, g)
		}
	}
	p.Groups = kept
	return p.compileSkips()
}

// focusExpr is the --ginkgo.focus expression.
func (p *Plan) focusExpr() string {
	if p.narrowRE != nil {
		return p.narrowRE.String()
	}
	return strings.Join(focus, "|")
}

// Narrow keeps only the tests of the focus that expr (a Go regular
// expression on full names, like Ginkgo's focus) matches: for a rerun of
// some tests.
func (p *Plan) Narrow(expr string) error {
	re, err := regexp.Compile(expr)
	if err != nil {
		return fmt.Errorf("narrow the focus: %w", err)
	}
	p.narrowRE = re
	return nil
}

// skipExpr is the --ginkgo.skip expression.
func (p *Plan) skipExpr() string { return p.skipRE.String() }

// labelFilter is the --ginkgo.label-filter expression ("" for none): the
// suite labels [Conformance] tests "Conformance".
func (p *Plan) labelFilter() string {
	if p.conformanceOnly {
		return "Conformance"
	}
	return ""
}

// ginkgoArgs are e2e.test's arguments that select the plan's tests.
func (p *Plan) ginkgoArgs() []string {
	args := []string{"--ginkgo.focus=" + p.focusExpr(), "--ginkgo.skip=" + p.skipExpr()}
	if lf := p.labelFilter(); lf != "" {
		args = append(args, "--ginkgo.label-filter="+lf)
	}
	return args
}

// InFocus reports whether the test is in the focus.
func (p *Plan) InFocus(name string) bool {
	return p.focusRE.MatchString(name) && (p.narrowRE == nil || p.narrowRE.MatchString(name))
}

// SkipGroupOf is the group that leaves the test out, or nil.
func (p *Plan) SkipGroupOf(name string) *SkipGroup {
	for i, g := range p.Groups {
		for _, part := range g.Parts {
			if strings.Contains(name, part) {
				return &p.Groups[i]
			}
		}
	}
	return nil
}

// selected reports whether the run starts the test.
func (p *Plan) selected(name string) bool {
	return p.InFocus(name) && p.SkipGroupOf(name) == nil && (!p.conformanceOnly || IsConformance(name))
}

// IsConformance reports whether a test is tagged [Conformance].
func IsConformance(name string) bool { return strings.Contains(name, "[Conformance]") }

// Part narrows the plan to part k of n (1 <= k <= n) of the tests it
// runs, among names (every test's full name: `e2e.test --list-tests`),
// and returns that part's names: the whole focus is too long for one
// sitting on the bed's two-node cluster (about 3 hours with ipvs-proxy at
// two tests at a time), and each part writes its own report. The tests
// are dealt out in name order; a test whose name holds another's goes
// with it, since the focus expression (the names, quoted) matches by
// substring as Ginkgo's does.
func (p *Plan) Part(names []string, k, n int) ([]string, error) {
	if n < 1 || k < 1 || k > n {
		return nil, fmt.Errorf("part %d of %d: want 1 <= part <= parts", k, n)
	}
	var run []string
	for _, name := range names {
		if p.selected(name) {
			run = append(run, name)
		}
	}
	slices.Sort(run)
	run = slices.Compact(run)
	// Groups: a name joins the first group that has a name holding it or
	// held by it.
	var groups [][]string
	for _, name := range run {
		i := slices.IndexFunc(groups, func(g []string) bool {
			return slices.ContainsFunc(g, func(o string) bool { return strings.Contains(o, name) || strings.Contains(name, o) })
		})
		if i < 0 {
			groups = append(groups, []string{name})
			continue
		}
		groups[i] = append(groups[i], name)
	}
	var part, quoted []string
	for i, g := range groups {
		if i%n == k-1 {
			part = append(part, g...)
		}
	}
	if len(part) == 0 {
		return nil, fmt.Errorf("part %d of %d has no tests (%d to run)", k, n, len(run))
	}
	slices.Sort(part)
	for _, name := range part {
		quoted = append(quoted, regexp.QuoteMeta(name))
	}
	if err := p.Narrow(strings.Join(quoted, "|")); err != nil {
		return nil, err
	}
	// Ginkgo runs what the expression matches and the skips do not:
	// nothing outside the part may match.
	for _, name := range names {
		if p.narrowRE.MatchString(name) && !p.skipRE.MatchString(name) && (!p.conformanceOnly || IsConformance(name)) &&
			!slices.Contains(part, name) {
			return nil, fmt.Errorf("part %d of %d would also run %q", k, n, name)
		}
	}
	return part, nil
}
