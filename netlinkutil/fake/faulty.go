package fake

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// WriteCall renders an IPVS write as the fake IPVS records it.
func WriteCall(w netlinkutil.Write) Call {
	k, rs := w.VirtualServer.VSKey, w.RealServer
	var s string
	switch w.Kind {
	case ktypes.OpAddVirtualServer:
		s = fmt.Sprintf(callAddVS, w.VirtualServer)
	case ktypes.OpUpdateVirtualServer:
		s = fmt.Sprintf(callUpdateVS, w.VirtualServer)
	case ktypes.OpDeleteVirtualServer:
		s = fmt.Sprintf(callDeleteVS, k)
	case ktypes.OpAddRealServer:
		s = fmt.Sprintf(callAddRS, k, rs.RSKey, rs.Weight, forwardNote(rs))
	case ktypes.OpUpdateRealServer:
		s = fmt.Sprintf(callUpdateRS, k, rs.RSKey, rs.Weight, forwardNote(rs))
	case ktypes.OpDeleteRealServer:
		s = fmt.Sprintf(callDeleteRS, k, rs.RSKey)
	default:
		s = w.String()
	}
	return Call(s)
}

// FaultyIPVS is another netlinkutil.IPVS (the real one) with the fake's
// error injection on its writes: before each write it asks its ErrorFunc,
// with the write rendered as the fake IPVS renders it, and a write that
// gets an error is not made and fails with it (in the context the real
// writes give their errors). Reads pass untouched.
type FaultyIPVS struct {
	netlinkutil.IPVS
	inject ErrorFunc
}

var _ netlinkutil.IPVS = (*FaultyIPVS)(nil)

// WrapIPVS wraps inner's writes with fn.
func WrapIPVS(inner netlinkutil.IPVS, fn ErrorFunc) *FaultyIPVS {
	return &FaultyIPVS{IPVS: inner, inject: fn}
}

func (f *FaultyIPVS) injected(w netlinkutil.Write) error {
	if err := f.inject(WriteCall(w)); err != nil {
		return netlinkutil.WrapWrite(w, err)
	}
	return nil
}

// Apply implements netlinkutil.IPVS: the writes that get no injected error
// go to the wrapped IPVS in one batch, in their order; each error lands on
// its own write.
func (f *FaultyIPVS) Apply(writes []netlinkutil.Write) []error {
	errs := make([]error, len(writes))
	pass := make([]netlinkutil.Write, 0, len(writes))
	idx := make([]int, 0, len(writes))
	for i, w := range writes {
		if errs[i] = f.injected(w); errs[i] == nil {
			pass = append(pass, w)
			idx = append(idx, i)
		}
	}
	if len(pass) == 0 {
		return errs
	}
	for j, err := range f.IPVS.Apply(pass) {
		errs[idx[j]] = err
	}
	return errs
}

// AddVirtualServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) AddVirtualServer(vs ktypes.VirtualServer) error {
	if err := f.injected(netlinkutil.Write{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs}); err != nil {
		return err
	}
	return f.IPVS.AddVirtualServer(vs)
}

// UpdateVirtualServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) UpdateVirtualServer(vs ktypes.VirtualServer) error {
	if err := f.injected(netlinkutil.Write{Kind: ktypes.OpUpdateVirtualServer, VirtualServer: vs}); err != nil {
		return err
	}
	return f.IPVS.UpdateVirtualServer(vs)
}

// DeleteVirtualServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) DeleteVirtualServer(vs ktypes.VSKey) error {
	if err := f.injected(netlinkutil.Write{Kind: ktypes.OpDeleteVirtualServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}}); err != nil {
		return err
	}
	return f.IPVS.DeleteVirtualServer(vs)
}

// AddRealServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) AddRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	if err := f.injected(netlinkutil.Write{Kind: ktypes.OpAddRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}, RealServer: rs}); err != nil {
		return err
	}
	return f.IPVS.AddRealServer(vs, rs)
}

// UpdateRealServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) UpdateRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	if err := f.injected(netlinkutil.Write{Kind: ktypes.OpUpdateRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}, RealServer: rs}); err != nil {
		return err
	}
	return f.IPVS.UpdateRealServer(vs, rs)
}

// DeleteRealServer implements netlinkutil.IPVS.
func (f *FaultyIPVS) DeleteRealServer(vs ktypes.VSKey, rs ktypes.RSKey) error {
	w := netlinkutil.Write{Kind: ktypes.OpDeleteRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}, RealServer: ktypes.RealServer{RSKey: rs}}
	if err := f.injected(w); err != nil {
		return err
	}
	return f.IPVS.DeleteRealServer(vs, rs)
}

// SetTimeouts implements netlinkutil.IPVS.
func (f *FaultyIPVS) SetTimeouts(t netlinkutil.Timeouts) error {
	if err := f.inject(Call(fmt.Sprintf(callSetTimeouts, t.TCP, t.TCPFin, t.UDP))); err != nil {
		return fmt.Errorf("set IPVS timeouts: %w", err)
	}
	return f.IPVS.SetTimeouts(t)
}

// FaultyLinks is another netlinkutil.Links (the real one) with the fake's
// error injection on its writes, like FaultyIPVS.
type FaultyLinks struct {
	netlinkutil.Links
	inject ErrorFunc
}

var _ netlinkutil.Links = (*FaultyLinks)(nil)

// WrapLinks wraps inner's writes with fn.
func WrapLinks(inner netlinkutil.Links, fn ErrorFunc) *FaultyLinks {
	return &FaultyLinks{Links: inner, inject: fn}
}

// WatchRemovals passes the inner links' notifications through (reads and
// notifications are not faulted); without a watcher inside, it fails.
func (l *FaultyLinks) WatchRemovals(ctx context.Context, link string, fn func(netlinkutil.Removal), onErr func(error)) error {
	w, ok := l.Links.(netlinkutil.RemovalWatcher)
	if !ok {
		return errors.New("the wrapped links send no notifications")
	}
	return w.WatchRemovals(ctx, link, fn, onErr)
}

func (l *FaultyLinks) injected(format string, args ...any) error {
	c := Call(fmt.Sprintf(format, args...))
	if err := l.inject(c); err != nil {
		return fmt.Errorf("%s: %w", c, err)
	}
	return nil
}

// EnsureDummy implements netlinkutil.Links.
func (l *FaultyLinks) EnsureDummy(name string) error {
	if err := l.injected(callEnsureDummy, name); err != nil {
		return err
	}
	return l.Links.EnsureDummy(name)
}

// DeleteLink implements netlinkutil.Links.
func (l *FaultyLinks) DeleteLink(name string) error {
	if err := l.injected(callDeleteLink, name); err != nil {
		return err
	}
	return l.Links.DeleteLink(name)
}

// AddAddress implements netlinkutil.Links.
func (l *FaultyLinks) AddAddress(link string, a netip.Addr) error {
	if err := l.injected(callAddAddress, link, a); err != nil {
		return err
	}
	return l.Links.AddAddress(link, a)
}

// DeleteAddress implements netlinkutil.Links.
func (l *FaultyLinks) DeleteAddress(link string, a netip.Addr) error {
	if err := l.injected(callDeleteAddress, link, a); err != nil {
		return err
	}
	return l.Links.DeleteAddress(link, a)
}

// AddLocalRoute implements netlinkutil.Links.
func (l *FaultyLinks) AddLocalRoute(link string, r netlinkutil.LocalRoute) error {
	if err := l.injected(callAddRoute, link, r); err != nil {
		return err
	}
	return l.Links.AddLocalRoute(link, r)
}

// DeleteLocalRoute implements netlinkutil.Links.
func (l *FaultyLinks) DeleteLocalRoute(link string, r netlinkutil.LocalRoute) error {
	if err := l.injected(callDeleteRoute, link, r.Prefix); err != nil {
		return err
	}
	return l.Links.DeleteLocalRoute(link, r)
}
