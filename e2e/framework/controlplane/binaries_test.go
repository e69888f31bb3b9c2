package controlplane

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// TestLocalSourcesKeyTheCache: a wrapper module's own code changes its
// cache key; tools.go, which only pins requirements, does not.
func TestLocalSourcesKeyTheCache(t *testing.T) {
	dir := t.TempDir()
	key := func() string {
		t.Helper()
		h := sha256.New()
		if err := hashLocalSources(h, dir); err != nil {
			t.Fatal(err)
		}
		return string(h.Sum(nil))
	}
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	empty := key()
	write("tools.go", "package x\n")
	if key() != empty {
		t.Error("tools.go changed the key")
	}
	write("suite/suite_test.go", "package suite\n")
	withSuite := key()
	if withSuite == empty {
		t.Error("the module's own test main did not change the key")
	}
	write("suite/suite_test.go", "package suite // edited\n")
	if key() == withSuite {
		t.Error("an edit of the module's own code did not change the key")
	}
}
