package cluster

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCNIConfig: the bridge's host-local ranges and routes, one of each per
// pod CIDR and family, in valid JSON.
func TestCNIConfig(t *testing.T) {
	for _, tc := range []struct {
		cidrs  []string
		ranges [][]map[string]string
		routes []map[string]string
	}{
		{[]string{"10.244.1.0/24"}, [][]map[string]string{{{"subnet": "10.244.1.0/24"}}}, []map[string]string{{"dst": "0.0.0.0/0"}}},
		{[]string{"10.244.1.0/24", "fd00:10:244:1::/64"},
			[][]map[string]string{{{"subnet": "10.244.1.0/24"}}, {{"subnet": "fd00:10:244:1::/64"}}},
			[]map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}}},
	} {
		var conf struct {
			Plugins []struct {
				Type string
				IPAM struct {
					Ranges [][]map[string]string
					Routes []map[string]string
				}
			}
		}
		if err := json.Unmarshal([]byte(cniConfig(tc.cidrs...)), &conf); err != nil {
			t.Fatalf("%v: %v", tc.cidrs, err)
		}
		if len(conf.Plugins) == 0 || conf.Plugins[0].Type != "bridge" {
			t.Fatalf("%v: plugins %+v", tc.cidrs, conf.Plugins)
		}
		if diff := cmp.Diff(tc.ranges, conf.Plugins[0].IPAM.Ranges); diff != "" {
			t.Errorf("%v: ranges (-want +got):\n%s", tc.cidrs, diff)
		}
		if diff := cmp.Diff(tc.routes, conf.Plugins[0].IPAM.Routes); diff != "" {
			t.Errorf("%v: routes (-want +got):\n%s", tc.cidrs, diff)
		}
	}
}
