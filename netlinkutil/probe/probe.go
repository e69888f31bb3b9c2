// Package probe asks the kernel whether it can do what ipvs-proxy needs by
// trying it: looking up the IPVS generic netlink family, creating (and
// deleting) a dummy interface and ipsets of each type. Trials run in a
// throwaway network namespace when the caller may create one, so that the
// node's own namespace never sees them; otherwise they run in the current
// namespace under names no one else uses, and are undone at once.
//
// Asking the kernel may make it load the module of the feature on demand,
// as ipvs-proxy itself would when it starts.
package probe

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Where tells which network namespace a trial ran in.
type Where string

// Namespaces a trial runs in.
const (
	TempNetns    Where = "a temporary network namespace"
	CurrentNetns Where = "the current network namespace"
)

// Run runs fn on an OS thread of its own in a new network namespace; the
// thread (and with it the namespace) ends when fn returns. When a namespace
// cannot be created (no CAP_SYS_ADMIN), fn runs in the current namespace.
// A panic in fn becomes an error.
func Run(fn func(Where) error) (Where, error) {
	type result struct {
		where Where
		err   error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: when this goroutine ends, Go terminates the
		// thread, which may be in the temporary namespace.
		runtime.LockOSThread()
		where := TempNetns
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			where = CurrentNetns
		}
		defer func() {
			if r := recover(); r != nil {
				done <- result{where, fmt.Errorf("probe failed: %v", r)}
			}
		}()
		done <- result{where, fn(where)}
	}()
	r := <-done
	return r.where, r.err
}

// IPVS reports whether the kernel has IPVS: its generic netlink family
// exists (the kernel loads ip_vs on this lookup if it can).
func IPVS() error {
	_, err := Run(func(Where) error {
		if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
			return fmt.Errorf("generic netlink family IPVS not found: %w", err)
		}
		return nil
	})
	return err
}

// probeName is a name for a trial object that no one else uses: short
// enough for an interface name (15 bytes).
func probeName(where Where) string {
	if where == TempNetns {
		return "ipvsp-probe"
	}
	return fmt.Sprintf("ipvsp%d", os.Getpid()%1000000000)
}

// Dummy creates a dummy interface and deletes it.
func Dummy() (Where, error) {
	return Run(func(where Where) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = probeName(where)
		link := &netlink.Dummy{LinkAttrs: attrs}
		if err := netlink.LinkAdd(link); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("create a dummy interface: the kernel has no dummy interface type: %w", err)
			}
			return fmt.Errorf("create a dummy interface: %w", err)
		}
		if err := netlink.LinkDel(link); err != nil {
			return fmt.Errorf("delete the trial dummy interface %s: %w", attrs.Name, err)
		}
		return nil
	})
}

// IPSetTypes returns the ipset types the iptables glue uses.
func IPSetTypes() []string {
	return []string{"hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "hash:net", "bitmap:port"}
}

// IPSetModule returns the kernel module of an ipset type
// ("hash:ip,port" -> "ip_set_hash_ipport").
func IPSetModule(typ string) string {
	out := []byte("ip_set_")
	for _, c := range []byte(typ) {
		switch c {
		case ':':
			out = append(out, '_')
		case ',':
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

// IPSet creates an IPv4 set of the type and destroys it.
func IPSet(typ string) (Where, error) {
	return Run(func(where Where) (err error) {
		name := "ipvs-proxy-probe"
		if where == CurrentNetns {
			name = fmt.Sprintf("ipvs-proxy-probe-%d", os.Getpid())
		}
		opts := netlink.IpsetCreateOptions{Family: unix.AF_INET}
		if typ == "bitmap:port" {
			opts = netlink.IpsetCreateOptions{PortFrom: 1, PortTo: 2}
		}
		if err := netlink.IpsetCreate(name, typ, opts); err != nil {
			return fmt.Errorf("create an ipset of type %s: %w", typ, err)
		}
		if err := netlink.IpsetDestroy(name); err != nil {
			return fmt.Errorf("destroy the trial ipset %s: %w", name, err)
		}
		return nil
	})
}
