package ipvsproxy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	fenceRE   = regexp.MustCompile("(?ms)^ *```.*?^ *```")
)

// anchor is GitHub's id of a heading: lower case, punctuation but '-' and
// '_' dropped, spaces turned into '-'.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the ids of a Markdown file's headings (outside code).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(b), ""), -1) {
		ids[anchor(m[1])] = true
	}
	return ids
}

// pages lists the repository's pages: every README.md (the front door and
// one page per room).
func pages(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "README.md" {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPageLinks checks that every relative link of the pages names a file
// or folder of the repository, and a heading of it when it has an anchor.
func TestPageLinks(t *testing.T) {
	ps := pages(t)
	for _, want := range []string{"README.md", "proxier/README.md", "e2e/README.md", "deploy/README.md"} {
		if !slices.Contains(ps, want) {
			t.Errorf("page %s is missing", want)
		}
	}
	for _, page := range ps {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(link, "#")
			path := page
			if target != "" {
				path = filepath.Join(filepath.Dir(page), target)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s: link %q: %v", page, link, err)
				continue
			}
			if frag == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: link %q: an anchor into %s, which is no Markdown page", page, link, path)
				continue
			}
			if !anchors(t, path)[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, link, path, frag)
			}
		}
	}
}
