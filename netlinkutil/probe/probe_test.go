package probe

import (
	"errors"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestIPSetModule(t *testing.T) {
	want := map[string]string{
		"hash:ip": "ip_set_hash_ip", "hash:ip,port": "ip_set_hash_ipport", "hash:ip,port,ip": "ip_set_hash_ipportip",
		"hash:ip,port,net": "ip_set_hash_ipportnet", "hash:net": "ip_set_hash_net", "bitmap:port": "ip_set_bitmap_port",
	}
	for _, typ := range IPSetTypes() {
		if got := IPSetModule(typ); got != want[typ] {
			t.Errorf("IPSetModule(%q) = %q, want %q", typ, got, want[typ])
		}
		delete(want, typ)
	}
	if len(want) > 0 {
		t.Errorf("IPSetTypes lacks %v", want)
	}
}

func TestRunTurnsPanicIntoError(t *testing.T) {
	_, err := Run(func(Where) error { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("Run of a panicking probe: %v, want an error with the panic", err)
	}
	sentinel := errors.New("sentinel")
	if _, err := Run(func(Where) error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Run: %v, want the probe's error", err)
	}
}

// TestRunIsolated: where a network namespace can be created (root), the
// probe sees a fresh one: nothing but lo.
func TestRunIsolated(t *testing.T) {
	var names []string
	where, err := Run(func(Where) error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	if where != TempNetns {
		t.Skipf("no temporary network namespace here (not root?): ran in %s", where)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "lo" {
		t.Errorf("links in the temporary namespace: %v, want only lo", names)
	}
}
