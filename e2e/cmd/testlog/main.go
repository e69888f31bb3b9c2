// Command testlog reads `go test -json` on its standard input, prints the
// plain -v log as it comes, and at the end the counts, the slowest tests
// and every failed or skipped one; it writes the run's figures (each
// test's outcome and time, the date, the commit, the machine) as a data
// file in -out (framework/results) and exits 1 unless every test passed
// and none was skipped: the Makefile's suites choose their tests with
// -run and -skip lists, never with t.Skip.
//
//	cd e2e && go test -json -run ... . | go run ./cmd/testlog -suite NAME -out ../bin/results
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
)

func main() {
	suite := flag.String("suite", "go-test", "the suite's name in the data file")
	out := flag.String("out", "", "directory of the data file (default: RESULTS_DIR, else bin/results)")
	slowest := flag.Int("slowest", 12, "how many of the slowest top-level tests to list")
	verbose := flag.Bool("v", false, "print every test's output as it comes (else only a failed test's)")
	flag.Parse()
	os.Exit(run(os.Stdin, os.Stdout, *suite, *out, *slowest, *verbose))
}

func run(in io.Reader, w io.Writer, suite, out string, slowest int, verbose bool) int {
	tr, err := results.ReadTestJSON(in, w, verbose)
	if err != nil {
		fmt.Fprintln(w, "testlog:", err)
		return 1
	}
	fmt.Fprintf(w, "\ntestlog: %s: %d passed, %d failed, %d skipped in %.0f s\n", suite, tr.Passed, tr.Failed, tr.Skipped, tr.WallSeconds)
	for _, t := range tr.Slowest(slowest) {
		fmt.Fprintf(w, "testlog:   %7.1f s  %-4s %s\n", t.Seconds, t.Outcome, t.Name)
	}
	if out == "" {
		out = results.Dir(os.Getenv)
	}
	if r, err := results.New(suite, tr, os.Getenv); err != nil {
		fmt.Fprintln(w, "testlog:", err)
	} else if p, err := results.Write(out, r); err != nil {
		fmt.Fprintln(w, "testlog:", err)
	} else {
		fmt.Fprintf(w, "testlog: figures in %s\n", p)
	}
	problems := tr.Problems()
	for _, p := range problems {
		fmt.Fprintln(w, "testlog:", p)
	}
	if len(problems) > 0 {
		return 1
	}
	return 0
}
