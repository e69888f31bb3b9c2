package netlinkutil

import "testing"

func TestConnReuseMode(t *testing.T) {
	for _, tc := range []struct {
		release string
		value   string
		set     bool
		err     bool
	}{
		{release: "3.10.0-1160.el7.x86_64"},                 // no such setting
		{release: "4.0.9"},                                  // not yet
		{release: "4.1.0", value: "0", set: true},           // the first with the setting
		{release: "4.19.0-27-amd64", value: "0", set: true}, // the 1 s stall
		{release: "5.8.18-100.fc31.x86_64", value: "0", set: true},
		{release: "5.9.0", value: "1", set: true}, // fixed: the kernel's default, restored if forced to 0
		{release: "5.10.0-28-amd64", value: "1", set: true},
		{release: "6.1.0-18-amd64\n", value: "1", set: true}, // Debian 12, as read from /proc
		{release: "", err: true},
		{release: "linux", err: true},
	} {
		value, set, err := ConnReuseMode(tc.release)
		if (err != nil) != tc.err || value != tc.value || set != tc.set {
			t.Errorf("ConnReuseMode(%q) = %q, %v, %v; want %q, %v, error %v", tc.release, value, set, err, tc.value, tc.set, tc.err)
		}
	}
}
