// Package kmod tells whether a kernel module is loaded, built in, loadable
// or missing, from the files the kernel and depmod publish: /proc/modules,
// /sys/module/<name>, and modules.builtin and modules.dep under
// /lib/modules/<release>. It can also load a module with modprobe.
package kmod

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// State is what the node knows of a module.
type State int

// States of a module, from worst to best.
const (
	// Missing: not loaded, not built in, and not among the installed modules.
	Missing State = iota
	// Unknown: not loaded or built in, and the installed modules cannot be
	// read (no /lib/modules/<release>), so it may or may not be loadable.
	Unknown
	// Loadable: installed, not loaded; modprobe (or the kernel, on first
	// use) can load it.
	Loadable
	// Builtin: compiled into the kernel.
	Builtin
	// Loaded: loaded as a module.
	Loaded
)

func (s State) String() string {
	switch s {
	case Missing:
		return "missing"
	case Unknown:
		return "unknown"
	case Loadable:
		return "loadable"
	case Builtin:
		return "built in"
	case Loaded:
		return "loaded"
	}
	return fmt.Sprintf("state-%d", int(s))
}

// Present reports whether the module's code is in the running kernel.
func (s State) Present() bool { return s == Loaded || s == Builtin }

// Info is the state of one module with a sentence that explains it.
type Info struct {
	Name   string
	State  State
	Detail string
}

// Paths are where the module files are; Default gives the real ones.
type Paths struct {
	ProcModules string // /proc/modules
	SysModule   string // /sys/module
	// ModulesDir is /lib/modules/<release>.
	ModulesDir string
}

// DefaultPaths returns the paths of the running kernel.
func DefaultPaths() (Paths, error) {
	rel, err := Release()
	if err != nil {
		return Paths{}, err
	}
	return Paths{ProcModules: "/proc/modules", SysModule: "/sys/module", ModulesDir: filepath.Join("/lib/modules", rel)}, nil
}

// Release returns the running kernel's release (uname -r).
func Release() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// Name normalizes a module name or file name as the kernel does: no
// directory, no .ko suffix (compressed or not), dashes as underscores.
func Name(s string) string {
	s = path.Base(strings.TrimSpace(s))
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// Table is one reading of the module files.
type Table struct {
	paths Paths
	// loaded holds the modules of /proc/modules; nil if it cannot be read.
	loaded   map[string]bool
	procErr  error
	builtin  map[string]bool
	loadable map[string]string // name -> file, relative to ModulesDir
	depErr   error
}

// Read reads /proc/modules, modules.builtin and modules.dep. Missing files
// are not errors: they show in the Details of Check.
func Read(p Paths) *Table {
	t := &Table{paths: p, builtin: map[string]bool{}, loadable: map[string]string{}}
	if b, err := os.ReadFile(p.ProcModules); err != nil {
		t.procErr = err
	} else {
		t.loaded = map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				t.loaded[Name(f[0])] = true
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(p.ModulesDir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			t.builtin[Name(line)] = true
		}
	}
	b, err := os.ReadFile(filepath.Join(p.ModulesDir, "modules.dep"))
	if err != nil {
		t.depErr = err
		return t
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		file, _, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		file = strings.TrimSpace(file)
		if _, dup := t.loadable[Name(file)]; !dup {
			t.loadable[Name(file)] = file
		}
	}
	if err := sc.Err(); err != nil {
		t.depErr = fmt.Errorf("read %s: %w", filepath.Join(p.ModulesDir, "modules.dep"), err)
	}
	return t
}

// ModuleSupport reports whether the kernel can load modules at all (it
// publishes /proc/modules).
func (t *Table) ModuleSupport() bool { return t.loaded != nil }

// Check tells the state of one module.
func (t *Table) Check(module string) Info {
	name := Name(module)
	info := Info{Name: name}
	dir := t.paths.ModulesDir
	switch {
	case t.loaded[name]:
		info.State, info.Detail = Loaded, name+" loaded"
		return info
	case t.builtin[name]:
		info.State, info.Detail = Builtin, name+" built into the kernel"
		return info
	}
	// A built-in module with parameters or a version has /sys/module/<name>
	// without a line in /proc/modules; a loaded one has both.
	if st, err := os.Stat(filepath.Join(t.paths.SysModule, name)); err == nil && st.IsDir() {
		if t.loaded == nil {
			info.State, info.Detail = Builtin, name+" built into the kernel"
			return info
		}
		if _, err := os.Stat(filepath.Join(t.paths.SysModule, name, "initstate")); errors.Is(err, fs.ErrNotExist) {
			info.State, info.Detail = Builtin, name+" built into the kernel"
			return info
		}
		// Loaded after /proc/modules was read.
		info.State, info.Detail = Loaded, name+" loaded"
		return info
	}
	if t.loaded == nil && errors.Is(t.procErr, fs.ErrNotExist) {
		info.State = Missing
		info.Detail = name + " is not built into the kernel, and the kernel cannot load modules (no " + t.paths.ProcModules + ")"
		return info
	}
	if file, ok := t.loadable[name]; ok {
		info.State = Loadable
		info.Detail = name + " not loaded; loadable (" + filepath.Join(dir, strings.TrimPrefix(file, "/")) + ")"
		if strings.HasPrefix(file, "/") {
			info.Detail = name + " not loaded; loadable (" + file + ")"
		}
		return info
	}
	if t.depErr != nil {
		info.State = Unknown
		info.Detail = fmt.Sprintf("%s not loaded, and whether it is loadable is unknown: %s is unreadable (%v)",
			name, filepath.Join(dir, "modules.dep"), shortErr(t.depErr))
		return info
	}
	info.State = Missing
	info.Detail = name + " not loaded, not built in, and not in " + filepath.Join(dir, "modules.dep")
	return info
}

// shortErr drops the path that an *fs.PathError repeats.
func shortErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Checker checks modules against the node's files, re-reading them after
// it loads a module.
type Checker struct {
	Paths Paths
	// Modprobe is the modprobe command (default "modprobe").
	Modprobe string
	table    *Table
}

// NewChecker returns a Checker of the running kernel.
func NewChecker() (*Checker, error) {
	p, err := DefaultPaths()
	if err != nil {
		return nil, err
	}
	return &Checker{Paths: p}, nil
}

func (c *Checker) read() *Table {
	if c.table == nil {
		c.table = Read(c.Paths)
	}
	return c.table
}

// Check tells the state of a module.
func (c *Checker) Check(module string) Info { return c.read().Check(module) }

// Refresh makes the next Check re-read the module files (after something
// may have loaded a module).
func (c *Checker) Refresh() { c.table = nil }

// ModuleSupport reports whether the kernel can load modules.
func (c *Checker) ModuleSupport() bool { return c.read().ModuleSupport() }

// Load runs modprobe for the module and re-reads the module files.
func (c *Checker) Load(ctx context.Context, module string) error {
	bin := c.Modprobe
	if bin == "" {
		bin = "modprobe"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, Name(module)).CombinedOutput()
	c.table = nil
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			return fmt.Errorf("modprobe %s: %w", Name(module), err)
		}
		return fmt.Errorf("modprobe %s: %w: %s", Name(module), err, msg)
	}
	return nil
}
