package glue

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
)

// pageBlock returns the fenced block between the page's markers
// "<!-- <name>: begin" and "<!-- <name>: end -->".
func pageBlock(t *testing.T, page, name string) string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- "+name+": begin")
	if !ok {
		t.Fatalf("%s: no marker %q", page, "<!-- "+name+": begin")
	}
	block, _, ok := strings.Cut(rest, "<!-- "+name+": end -->")
	if !ok {
		t.Fatalf("%s: no marker %q", page, "<!-- "+name+": end -->")
	}
	_, block, _ = strings.Cut(block, "-->\n") // the rest of the begin marker's line
	inner, ok := strings.CutPrefix(strings.TrimSpace(block), "```\n")
	if !ok {
		t.Fatalf("%s: the %s block is not a fenced block:\n%s", page, name, block)
	}
	inner, ok = strings.CutSuffix(inner, "```")
	if !ok {
		t.Fatalf("%s: the %s block does not end its fence:\n%s", page, name, block)
	}
	return inner
}

// TestRuleDumpInPage keeps the rule dump that proxier/README.md shows equal
// to the rules the glue programs (IPv4, with a cluster CIDR).
func TestRuleDumpInPage(t *testing.T) {
	got := Dump(Rules(RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}))
	if diff := cmp.Diff(got, pageBlock(t, "../README.md", "rule dump")); diff != "" {
		t.Errorf("proxier/README.md's rule dump differs from the glue's rules (-code +page):\n%s", diff)
	}
}
