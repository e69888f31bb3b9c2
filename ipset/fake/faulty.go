package fake

import (
	"errors"
	"fmt"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
)

// Faulty is another ipset.Interface (the kernel's) with the fake's error
// injection on its writes: before each write it asks its ErrorFunc, with
// the write rendered as the fake renders it, and a write that gets an
// error is not made and fails with it. Add and Del ask once per entry
// ("Add SET ENTRY"): the entries that get an error are left out, the
// others are written, and the error names each one left out, as the
// kernel's refused entries are. Reads pass untouched.
type Faulty struct {
	ipset.Interface
	inject ErrorFunc
}

var _ ipset.Interface = (*Faulty)(nil)

// Wrap wraps inner's writes with fn.
func Wrap(inner ipset.Interface, fn ErrorFunc) *Faulty { return &Faulty{Interface: inner, inject: fn} }

func (f *Faulty) injected(format string, args ...any) error {
	c := Call(fmt.Sprintf(format, args...))
	if err := f.inject(c); err != nil {
		return fmt.Errorf("ipset: %s: %w", c, err)
	}
	return nil
}

// Create implements ipset.Interface.
func (f *Faulty) Create(s ipset.Spec) error {
	n := s.Normalized()
	if err := f.injected(callCreate, n.Name, n.Type, n.Family); err != nil {
		return err
	}
	return f.Interface.Create(s)
}

// Destroy implements ipset.Interface.
func (f *Faulty) Destroy(name string) error {
	if err := f.injected(callDestroy, name); err != nil {
		return err
	}
	return f.Interface.Destroy(name)
}

// Swap implements ipset.Interface.
func (f *Faulty) Swap(a, b string) error {
	if err := f.injected(callSwap, a, b); err != nil {
		return err
	}
	return f.Interface.Swap(a, b)
}

// Flush implements ipset.Interface.
func (f *Faulty) Flush(name string) error {
	if err := f.injected(callFlush, name); err != nil {
		return err
	}
	return f.Interface.Flush(name)
}

// Add implements ipset.Interface.
func (f *Faulty) Add(name string, entries ...ipset.Entry) error {
	return f.write("Add", name, entries, f.Interface.Add)
}

// Del implements ipset.Interface.
func (f *Faulty) Del(name string, entries ...ipset.Entry) error {
	return f.write("Del", name, entries, f.Interface.Del)
}

func (f *Faulty) write(op, name string, entries []ipset.Entry, fn func(string, ...ipset.Entry) error) error {
	var errs []error
	pass := make([]ipset.Entry, 0, len(entries))
	for _, e := range entries {
		if err := f.injected(callWrite, op, name, e); err != nil {
			errs = append(errs, err)
			continue
		}
		pass = append(pass, e)
	}
	if len(pass) > 0 {
		errs = append(errs, fn(name, pass...))
	}
	return errors.Join(errs...)
}
