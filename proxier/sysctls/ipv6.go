package sysctls

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// HasIPv6 reports whether the node's kernel has IPv6 (not booted with
// ipv6.disable=1): its settings exist under root (Root()).
func HasIPv6(root string) (bool, error) {
	_, err := os.Stat(filepath.Join(root, "net/ipv6/conf/all"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("look for IPv6 on the node: %w", err)
}

// IPv6Forwarder sets IPv6Forwarding once the node serves an IPv6 virtual
// server, and never before: kube-proxy never sets it, and a node that
// forwards IPv6 stops accepting router advertisements, so an IPv4-only
// cluster's nodes keep their IPv6 as it was. It is a consumer of the
// agent's plans; a failure to set it is retried as any consumer's is.
type IPv6Forwarder struct {
	log *zap.Logger
	// ensure writes a setting and returns its old value.
	ensure func(name, value string) (string, error)
	// ipv6 are the Services with an IPv6 virtual server.
	ipv6 map[types.NamespacedName]bool
	done bool
}

// NewIPv6Forwarder returns the forwarder of the settings under root
// (Root()).
func NewIPv6Forwarder(root string, log *zap.Logger) *IPv6Forwarder {
	s := netlinkutil.Sysctls{Root: root}
	return &IPv6Forwarder{log: log, ensure: s.Ensure, ipv6: map[types.NamespacedName]bool{}}
}

// Name names the consumer.
func (f *IPv6Forwarder) Name() string { return "ipv6-forwarding" }

// SetPlan records whether the Service has an IPv6 virtual server.
func (f *IPv6Forwarder) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	if plan != nil && slices.ContainsFunc(plan.VirtualServers, func(vs model.VSPlan) bool { return vs.Address.Is6() }) {
		f.ipv6[name] = true
	} else {
		delete(f.ipv6, name)
	}
}

// Sync sets IPv6 forwarding when a Service first needs it, and again on a
// full sync (someone may have reset it). It is never unset: other IPv6
// traffic of the node (pods) may rely on it by then.
func (f *IPv6Forwarder) Sync(full bool) error {
	if len(f.ipv6) == 0 || (f.done && !full) {
		return nil
	}
	old, err := f.ensure(IPv6Forwarding.Name, IPv6Forwarding.Value)
	if err != nil {
		return fmt.Errorf("%d Services have IPv6 virtual servers (%s among them): %w", len(f.ipv6), f.someService(), err)
	}
	if !f.done || old != IPv6Forwarding.Value {
		f.log.Info("set sysctl for the IPv6 Services", zap.String("name", IPv6Forwarding.Name), zap.String("value", IPv6Forwarding.Value),
			zap.String("was", old), zap.String("service", f.someService()), zap.Int("services", len(f.ipv6)))
	}
	f.done = true
	return nil
}

// someService names the first IPv6 Service, for logs.
func (f *IPv6Forwarder) someService() string {
	var names []string
	for n := range f.ipv6 {
		names = append(names, n.String())
	}
	slices.Sort(names)
	return names[0]
}
