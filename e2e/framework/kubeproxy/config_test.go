package kubeproxy

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// The configuration as kube-proxy reads it (its own v1alpha1 types,
// strictly): conntrack all zero by default, so kube-proxy leaves the
// shared VM's conntrack settings alone, and absent with ConntrackDefaults,
// so kube-proxy's defaulting sets its own (CLOSE_WAIT 1h among them).
func TestConfigConntrack(t *testing.T) {
	zero := func(c kpv1alpha1.KubeProxyConntrackConfiguration) bool {
		return c.MaxPerCore != nil && *c.MaxPerCore == 0 && c.Min != nil && *c.Min == 0 &&
			c.TCPEstablishedTimeout != nil && c.TCPEstablishedTimeout.Duration == 0 &&
			c.TCPCloseWaitTimeout != nil && c.TCPCloseWaitTimeout.Duration == 0 &&
			c.UDPTimeout.Duration == 0 && c.UDPStreamTimeout.Duration == 0
	}
	for _, tc := range []struct {
		name     string
		o        Options
		wantZero bool
	}{
		{"shared VM", Options{}, true},
		{"own cluster", Options{ConntrackDefaults: true}, false},
		{"own cluster, nftables", Options{ConntrackDefaults: true, Mode: ModeNFTables}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c kpv1alpha1.KubeProxyConfiguration
			if err := yaml.UnmarshalStrict([]byte(tc.o.config()), &c); err != nil {
				t.Fatalf("kube-proxy would refuse the configuration: %v\n%s", err, tc.o.config())
			}
			if got := zero(c.Conntrack); got != tc.wantZero {
				t.Errorf("conntrack section all zero: %v, want %v\n%s", got, tc.wantZero, tc.o.config())
			}
			if !tc.wantZero && (c.Conntrack.MaxPerCore != nil || c.Conntrack.TCPCloseWaitTimeout != nil) {
				t.Errorf("conntrack set (%+v): kube-proxy's defaults would not apply", c.Conntrack)
			}
			mode := ModeIPVS
			if tc.o.Mode != "" {
				mode = tc.o.Mode
			}
			if string(c.Mode) != mode {
				t.Errorf("mode %q, want %q", c.Mode, mode)
			}
			sync := c.IPVS.SyncPeriod
			if mode == ModeNFTables {
				sync = c.NFTables.SyncPeriod
			}
			if sync != (metav1.Duration{Duration: 30 * time.Second}) {
				t.Errorf("%s.syncPeriod %v, want 30s (the mode's section lost)", mode, sync.Duration)
			}
		})
	}
}
