package vm

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

// archive collects the entries of a newc ("070701") cpio archive, the
// format the kernel unpacks as initramfs. Entries are keyed by their guest
// path; adding a path again replaces the entry. Parent directories are
// added on Write.
type archive struct {
	entries map[string]entry
}

type entry struct {
	mode     uint32 // type and permission bits, as in stat(2)
	hostPath string // regular file: contents from here, unless data != nil
	data     []byte
	target   string // symlink
	rdev     [2]uint32
}

// cpio type bits (same as in stat(2)).
const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioLink = 0o120000
	cpioChr  = 0o020000
)

func newArchive() *archive { return &archive{entries: map[string]entry{}} }

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// dir adds a directory.
func (a *archive) dir(p string, perm fs.FileMode) {
	a.entries[clean(p)] = entry{mode: cpioDir | uint32(perm.Perm())}
}

// file adds a regular file copied from hostPath, with permission perm.
func (a *archive) file(p, hostPath string, perm fs.FileMode) {
	a.entries[clean(p)] = entry{mode: cpioReg | uint32(perm.Perm()), hostPath: hostPath}
}

// bytes adds a regular file with the given content.
func (a *archive) bytes(p string, data []byte, perm fs.FileMode) {
	a.entries[clean(p)] = entry{mode: cpioReg | uint32(perm.Perm()), data: data}
}

// symlink adds a symbolic link to target.
func (a *archive) symlink(p, target string) {
	a.entries[clean(p)] = entry{mode: cpioLink | 0o777, target: target}
}

// charDev adds a character device node.
func (a *archive) charDev(p string, perm fs.FileMode, major, minor uint32) {
	a.entries[clean(p)] = entry{mode: cpioChr | uint32(perm.Perm()), rdev: [2]uint32{major, minor}}
}

// has reports whether p is in the archive.
func (a *archive) has(p string) bool {
	_, ok := a.entries[clean(p)]
	return ok
}

// writeFile writes the archive to a new file at p.
func (a *archive) writeFile(p string) error {
	f, err := os.Create(p)
	if err != nil {
		return fmt.Errorf("cpio: %w", err)
	}
	if err := a.write(f); err != nil {
		f.Close()
		return fmt.Errorf("cpio %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cpio %s: %w", p, err)
	}
	return nil
}

// write writes the archive: parents before children, in sorted order, all
// owned by root with mtime 0 and one link each (so the kernel never takes
// two entries for hard links of each other), then the trailer.
func (a *archive) write(w io.Writer) error {
	for p := range a.entries {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := a.entries[d]; !ok {
				a.entries[d] = entry{mode: cpioDir | 0o755}
			}
		}
	}
	names := make([]string, 0, len(a.entries))
	for p := range a.entries {
		names = append(names, p)
	}
	sort.Strings(names)

	bw := bufio.NewWriterSize(w, 1<<20)
	for i, name := range names {
		if err := writeEntry(bw, name, uint32(i+1), a.entries[name]); err != nil {
			return err
		}
	}
	if err := writeHeader(bw, "TRAILER!!!", 0, 0, 1, 0, [2]uint32{}); err != nil {
		return err
	}
	return bw.Flush()
}

func writeEntry(w *bufio.Writer, name string, ino uint32, e entry) error {
	var body io.Reader
	var size int64
	switch e.mode &^ 0o7777 {
	case cpioReg:
		if e.data != nil || e.hostPath == "" {
			body, size = strings.NewReader(string(e.data)), int64(len(e.data))
			break
		}
		f, err := os.Open(e.hostPath)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s (for %s) is not a regular file", e.hostPath, name)
		}
		body, size = f, st.Size()
	case cpioLink:
		body, size = strings.NewReader(e.target), int64(len(e.target))
	}
	if size > 0xffffffff {
		return fmt.Errorf("%s: %d bytes is too large for cpio", name, size)
	}
	nlink := 1
	if e.mode&^0o7777 == cpioDir {
		nlink = 2
	}
	if err := writeHeader(w, name, ino, e.mode, nlink, uint32(size), e.rdev); err != nil {
		return err
	}
	if body == nil {
		return nil
	}
	n, err := io.Copy(w, io.LimitReader(body, size))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("%s: changed while archived (%d of %d bytes)", name, n, size)
	}
	return pad4(w, n)
}

func writeHeader(w *bufio.Writer, name string, ino, mode uint32, nlink int, size uint32, rdev [2]uint32) error {
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with its NUL), check
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev[0], rdev[1], len(name)+1, 0)
	if _, err := w.WriteString(hdr); err != nil {
		return err
	}
	if _, err := w.WriteString(name + "\x00"); err != nil {
		return err
	}
	return pad4(w, int64(len(hdr)+len(name)+1))
}

func pad4(w *bufio.Writer, n int64) error {
	if r := n % 4; r != 0 {
		_, err := w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
