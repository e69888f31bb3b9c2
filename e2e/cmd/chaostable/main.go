// Command table prints the rows of the reliability suite (`make chaos`) as
// a Markdown table: every <case>.json of a directory (default $CHAOS_OUT,
// else bin/chaos), and keeps them as one run's data (framework/results)
// under -suite: "chaos" for `make chaos`, "<target>-cases" for the
// suites that boot beds of their own (chaos-nodes, chaos-soak,
// chaos-outage), whose tables the README lists run by run.
// It fails when there is no row or a row counts leaks.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
)

func main() {
	dir := flag.String("dir", chaos.Dir(), "the directory of the rows (<case>.json)")
	suite := flag.String("suite", "chaos", "the name the rows are kept under (chaos, or <target>-cases)")
	flag.Parse()
	rows, err := chaos.Read(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if len(rows) == 0 {
		fmt.Fprintf(os.Stderr, "no chaos rows in %s\n", *dir)
		os.Exit(1)
	}
	fmt.Print(chaos.Table(rows))
	// The rows as data (framework/results), before the verdict.
	if p, err := results.Keep(*suite, rows); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		fmt.Fprintf(os.Stderr, "figures in %s\n", p)
	}
	for _, r := range rows {
		if r.Leaks > 0 {
			fmt.Fprintf(os.Stderr, "%s: %d leaks\n", r.Case, r.Leaks)
			os.Exit(1)
		}
	}
}
