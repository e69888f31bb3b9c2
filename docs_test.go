package ipvsproxy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The repository's pages: the README and one page per room.
var pages = []string{"README.md", "proxier/README.md", "e2e/README.md", "deploy/README.md"}

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

// TestPageLinks checks that every relative link of the pages names a file
// or folder of the repository, and a heading of it when it has an anchor.
func TestPageLinks(t *testing.T) {
	for _, page := range pages {
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

// TestPagesListed: every README.md of the tree is among the pages checked.
func TestPagesListed(t *testing.T) {
	listed := map[string]bool{}
	for _, p := range pages {
		listed[p] = true
	}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "README.md" && !listed[filepath.ToSlash(p)] {
			t.Errorf("%s is not among the pages whose links are checked", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
