package sysctls

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// planWith is a plan with one virtual server on addr.
func planWith(addr string) *model.ServicePlan {
	return &model.ServicePlan{VirtualServers: []model.VSPlan{{VirtualServer: ktypes.VirtualServer{
		VSKey: ktypes.VSKey{Address: netip.MustParseAddr(addr), Protocol: ktypes.TCP, Port: 80}}}}}
}

// TestIPv6Forwarder: IPv6 forwarding is written only once a Service has an
// IPv6 virtual server (never on an IPv4-only cluster), once, again on a
// full sync, and a failed write is an error naming the Services.
func TestIPv6Forwarder(t *testing.T) {
	var writes []string
	var fail error
	value := "0"
	f := NewIPv6Forwarder("", zap.NewNop())
	f.ensure = func(name, v string) (string, error) {
		if fail != nil {
			return "", fail
		}
		writes = append(writes, name+"="+v)
		old := value
		value = v
		return old, nil
	}
	v4, v6 := types.NamespacedName{Namespace: "a", Name: "v4"}, types.NamespacedName{Namespace: "a", Name: "v6"}
	f.SetPlan(v4, planWith("10.96.0.1"))
	for _, full := range []bool{false, true} {
		if err := f.Sync(full); err != nil || len(writes) != 0 {
			t.Fatalf("IPv4 Services only: Sync(%v) = %v, writes %v; want none", full, err, writes)
		}
	}
	f.SetPlan(v6, planWith("fd00::1"))
	fail = errors.New("read-only file system")
	if err := f.Sync(false); err == nil || !errors.Is(err, fail) {
		t.Fatalf("Sync with the write failing = %v, want the failure", err)
	}
	fail = nil
	if err := f.Sync(false); err != nil || len(writes) != 1 || writes[0] != "net/ipv6/conf/all/forwarding=1" || value != "1" {
		t.Fatalf("an IPv6 Service: Sync = %v, writes %v", err, writes)
	}
	if err := f.Sync(false); err != nil || len(writes) != 1 {
		t.Fatalf("partial Sync after it is set: %v, writes %v; want no new write", err, writes)
	}
	if err := f.Sync(true); err != nil || len(writes) != 2 {
		t.Fatalf("full Sync: %v, writes %v; want it written again", err, writes)
	}
	f.SetPlan(v6, nil)
	if err := f.Sync(true); err != nil || len(writes) != 2 || value != "1" {
		t.Fatalf("the IPv6 Service gone: %v, writes %v, value %s; want no write and forwarding left on", err, writes, value)
	}
}

// TestHasIPv6: the kernel's IPv6 is told by its settings under the root.
func TestHasIPv6(t *testing.T) {
	root := t.TempDir()
	if has, err := HasIPv6(root); has || err != nil {
		t.Fatalf("no net/ipv6: HasIPv6 = %v, %v; want false", has, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "net/ipv6/conf/all"), 0o755); err != nil {
		t.Fatal(err)
	}
	if has, err := HasIPv6(root); !has || err != nil {
		t.Fatalf("with net/ipv6: HasIPv6 = %v, %v; want true", has, err)
	}
}
