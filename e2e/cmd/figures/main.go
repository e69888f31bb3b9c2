// Command figures keeps the runs' figures in the tree and writes the
// README tables from them (`make results`): it moves every run that the
// suites wrote into -from (bin/results) into -dir (docs/results), then
// rewrites each generated table of -readme, a section between
// "<!-- results:NAME -->" and "<!-- /results -->", from the files in -dir.
// With -check it changes nothing and fails if a table differs from what
// the files give (its test does the same for the tree).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	from := flag.String("from", "bin/results", "where the suites wrote their runs (moved into -dir; empty: none)")
	dir := flag.String("dir", "docs/results", "the kept runs")
	readme := flag.String("readme", "e2e/README.md", "the page whose tables are generated")
	check := flag.Bool("check", false, "change nothing; fail if a table is not what the files give")
	flag.Parse()
	if err := run(*from, *dir, *readme, *check); err != nil {
		fmt.Fprintln(os.Stderr, "figures:", err)
		os.Exit(1)
	}
}

func run(from, dir, readme string, check bool) error {
	if from != "" && !check {
		n, err := moveRuns(from, dir)
		if err != nil {
			return err
		}
		fmt.Printf("figures: %d run(s) moved from %s into %s\n", n, from, dir)
	}
	page, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	tables, err := render(dir)
	if err != nil {
		return err
	}
	updated, err := replaceSections(string(page), tables)
	if err != nil {
		return fmt.Errorf("%s: %w", readme, err)
	}
	if updated == string(page) {
		fmt.Printf("figures: %s's tables are what %s gives\n", readme, dir)
		return nil
	}
	if check {
		return fmt.Errorf("%s's tables differ from what %s gives: run `make results`", readme, dir)
	}
	fmt.Printf("figures: %s's tables rewritten from %s\n", readme, dir)
	return os.WriteFile(readme, []byte(updated), 0o644)
}

// moveRuns moves every *.json of from into dir.
func moveRuns(from, dir string) (int, error) {
	paths, err := filepath.Glob(filepath.Join(from, "*.json"))
	if err != nil || len(paths) == 0 {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o644); err != nil {
			return 0, err
		}
		if err := os.Remove(p); err != nil {
			return 0, err
		}
	}
	return len(paths), nil
}
