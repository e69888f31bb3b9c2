package main

import (
	"bufio"
	_ "embed"
	"fmt"
	"regexp"
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

// skipGroup is tests left out for one reason.
type skipGroup struct {
	Reason string
	// Parts are literal parts of full test names (a tag such as
	// [Feature:LoadBalancer], or a whole name).
	Parts []string
}

// Short is the reason up to its first colon (for table cells).
func (g *skipGroup) Short() string {
	short, _, _ := strings.Cut(g.Reason, ": ")
	return short
}

// plan is what a run selects.
type plan struct {
	focusRE, skipRE *regexp.Regexp
	groups          []skipGroup
	conformanceOnly bool
}

// parseSkips reads the skip list: "## reason" opens a group, each other
// non-empty line that is not a "#" comment is a literal part of the full
// names of the tests the group leaves out.
func parseSkips(text string) ([]skipGroup, error) {
	var groups []skipGroup
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			groups = append(groups, skipGroup{Reason: strings.TrimSpace(line[3:])})
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

func newPlan(conformanceOnly bool) (*plan, error) { return newPlanFrom(skipsText, conformanceOnly) }

// newPlanFrom is newPlan with the skip list's text.
func newPlanFrom(skips string, conformanceOnly bool) (*plan, error) {
	groups, err := parseSkips(skips)
	if err != nil {
		return nil, err
	}
	var parts []string
	for _, g := range groups {
		for _, p := range g.Parts {
			parts = append(parts, regexp.QuoteMeta(p))
		}
	}
	p := &plan{groups: groups, conformanceOnly: conformanceOnly}
	p.focusRE = regexp.MustCompile(p.focusExpr())
	if p.skipRE, err = regexp.Compile(strings.Join(parts, "|")); err != nil {
		return nil, fmt.Errorf("skip list: %w", err)
	}
	return p, nil
}

// focusExpr is the --ginkgo.focus expression.
func (p *plan) focusExpr() string { return strings.Join(focus, "|") }

// skipExpr is the --ginkgo.skip expression.
func (p *plan) skipExpr() string { return p.skipRE.String() }

// labelFilter is the --ginkgo.label-filter expression ("" for none): the
// suite labels [Conformance] tests "Conformance".
func (p *plan) labelFilter() string {
	if p.conformanceOnly {
		return "Conformance"
	}
	return ""
}

// ginkgoArgs are e2e.test's arguments that select the plan's tests.
func (p *plan) ginkgoArgs() []string {
	args := []string{"--ginkgo.focus=" + p.focusExpr(), "--ginkgo.skip=" + p.skipExpr()}
	if lf := p.labelFilter(); lf != "" {
		args = append(args, "--ginkgo.label-filter="+lf)
	}
	return args
}

func (p *plan) inFocus(name string) bool { return p.focusRE.MatchString(name) }

// skipGroup is the group that leaves the test out, or nil.
func (p *plan) skipGroup(name string) *skipGroup {
	for i, g := range p.groups {
		for _, part := range g.Parts {
			if strings.Contains(name, part) {
				return &p.groups[i]
			}
		}
	}
	return nil
}

// selected reports whether the run starts the test.
func (p *plan) selected(name string) bool {
	return p.inFocus(name) && p.skipGroup(name) == nil && (!p.conformanceOnly || isConformance(name))
}

func isConformance(name string) bool { return strings.Contains(name, "[Conformance]") }
