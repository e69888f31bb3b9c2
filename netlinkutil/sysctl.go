package netlinkutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Sysctls reads and writes kernel parameters under a /proc/sys root.
type Sysctls struct {
	// Root is normally /proc/sys; tests point it elsewhere.
	Root string
}

// Get reads a parameter such as "net/ipv4/vs/conntrack".
func (s Sysctls) Get(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.Root, name))
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Ensure sets a parameter if it differs and returns its previous value.
func (s Sysctls) Ensure(name, value string) (old string, err error) {
	old, err = s.Get(name)
	if err != nil {
		return "", err
	}
	if old == value {
		return old, nil
	}
	if err := os.WriteFile(filepath.Join(s.Root, name), []byte(value), 0o644); err != nil {
		return old, fmt.Errorf("set sysctl %s=%s: %w", name, value, err)
	}
	return old, nil
}
