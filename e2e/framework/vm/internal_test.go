package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseKernelABI(t *testing.T) {
	out := "linux-image-amd64\n  Depends: linux-image-6.1.0-48-amd64\n"
	if abi, err := parseKernelABI(out); err != nil || abi != "6.1.0-48-amd64" {
		t.Errorf("parseKernelABI = %q, %v", abi, err)
	}
	if _, err := parseKernelABI("linux-image-amd64\n"); err == nil {
		t.Error("parseKernelABI of no dependency: no error")
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/net/netfilter/ipvs/ip_vs.ko":       "ip_vs",
		"kernel/crypto/crc32c-generic.ko":          "crc32c_generic",
		"kernel/net/netfilter/xt_MASQUERADE.ko.xz": "xt_MASQUERADE",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", in, got, want)
		}
	}
}

// cpioEntry is what readCPIO gives back of an archive entry.
type cpioEntry struct {
	Mode  uint32
	Nlink int
	Data  string
	Rdev  [2]uint32
}

// readCPIO parses a newc archive (enough of it for the test).
func readCPIO(t *testing.T, b []byte) (names []string, entries map[string]cpioEntry) {
	t.Helper()
	entries = map[string]cpioEntry{}
	field := func(h []byte, i int) uint32 {
		v, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, h[:6])
		}
		size, nameSize := int(field(h, 6)), int(field(h, 11))
		name := string(b[off+110 : off+110+nameSize-1])
		off = align(off + 110 + nameSize)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return names, entries
		}
		names = append(names, name)
		entries[name] = cpioEntry{Mode: field(h, 1), Nlink: int(field(h, 4)), Data: string(b[off : off+size]),
			Rdev: [2]uint32{field(h, 9), field(h, 10)}}
		off = align(off + size)
	}
}

func TestArchive(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "bin")
	if err := os.WriteFile(host, []byte("hello"), 0o755); err != nil {
		t.Fatal(err)
	}
	ar := newArchive()
	ar.file("/usr/bin/tool", host, 0o755)
	ar.bytes("etc/conf", []byte("abc"), 0o644)
	ar.symlink("lib", "usr/lib")
	ar.charDev("dev/console", 0o600, 5, 1)
	ar.bytes("etc/conf", []byte("replaced"), 0o600)
	var buf bytes.Buffer
	if err := ar.write(&buf); err != nil {
		t.Fatal(err)
	}
	names, entries := readCPIO(t, buf.Bytes())
	if diff := cmp.Diff([]string{"dev", "dev/console", "etc", "etc/conf", "lib", "usr", "usr/bin", "usr/bin/tool"}, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	want := map[string]cpioEntry{
		"dev":          {Mode: 0o40755, Nlink: 2},
		"dev/console":  {Mode: 0o20600, Nlink: 1, Rdev: [2]uint32{5, 1}},
		"etc":          {Mode: 0o40755, Nlink: 2},
		"etc/conf":     {Mode: 0o100600, Nlink: 1, Data: "replaced"},
		"lib":          {Mode: 0o120777, Nlink: 1, Data: "usr/lib"},
		"usr":          {Mode: 0o40755, Nlink: 2},
		"usr/bin":      {Mode: 0o40755, Nlink: 2},
		"usr/bin/tool": {Mode: 0o100755, Nlink: 1, Data: "hello"},
	}
	if diff := cmp.Diff(want, entries); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4 (archives are concatenated)", buf.Len())
	}
}
