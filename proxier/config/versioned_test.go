package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/config/v1alpha1"
)

const versionedHeader = "apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\n"

// everyOptionFlat sets every option in the flat form.
const everyOptionFlat = `
kubeconfig: /etc/ipvs-proxy/kubeconfig.conf
hostnameOverride: node-7
interface: ipvs1
scheduler: sh
schedulerFlags: sh-port
nodePortAddresses: [10.0.0.0/8]
nodePortRange: 30000-31000
externalIPCIDRs: [198.51.100.0/24, "2001:db8::/64"]
excludeCIDRs: [10.96.100.0/24]
ipFamilies: [IPv4]
routeServiceCIDRs: true
serviceCIDRs: [10.96.0.0/12]
minSyncPeriod: 2s
syncPeriod: 1m
tcpTimeout: 15m
tcpFinTimeout: 30s
udpTimeout: 10s
logLevel: debug
logFormat: console
conntrackMaxPerCore: 0
conntrackMin: 1000
conntrackTCPEstablishedTimeout: 2h
conntrackTCPCloseWaitTimeout: 30m
conntrackTCPBeLiberal: true
conntrackUDPTimeout: 30s
conntrackUDPStreamTimeout: 2m
clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/56"]
masqueradeAll: true
acceptServiceTraffic: true
detectLocalMode: BridgeInterface
podBridgeInterface: cni0
podInterfaceNamePrefix: veth
iptablesBackend: nft
strictARP: true
metricsBindAddress: 0.0.0.0:10249
healthzBindAddress: 127.0.0.1:10256
debugBindAddress: 127.0.0.1:6060
profiling: true
serviceTrafficMetrics: true
takeoverKubeProxy: true
serviceMaxVirtualServers: 1000
serviceMaxRealServersPerVirtualServer: 2000
serviceMaxRealServers: 3000
serviceMaxSetEntries: 4000
directServerReturn: true
guePort: 7080
sloppyTCP: true
`

// everyOptionVersioned is everyOptionFlat as an IPVSProxyConfiguration.
const everyOptionVersioned = versionedHeader + `
clientConnection:
  kubeconfig: /etc/ipvs-proxy/kubeconfig.conf
hostnameOverride: node-7
ipFamilies: [IPv4]
nodePortAddresses: [10.0.0.0/8]
nodePortRange: 30000-31000
externalIPCIDRs: [198.51.100.0/24, "2001:db8::/64"]
clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/56"]
detectLocalMode: BridgeInterface
detectLocal:
  bridgeInterface: cni0
  interfaceNamePrefix: veth
ipvs:
  interface: ipvs1
  scheduler: sh
  schedulerFlags: sh-port
  syncPeriod: 1m
  minSyncPeriod: 2s
  excludeCIDRs: [10.96.100.0/24]
  strictARP: true
  tcpTimeout: 15m
  tcpFinTimeout: 30s
  udpTimeout: 10s
  routeServiceCIDRs: true
  serviceCIDRs: [10.96.0.0/12]
iptables:
  masqueradeAll: true
  acceptServiceTraffic: true
  backend: nft
conntrack:
  maxPerCore: 0
  min: 1000
  tcpEstablishedTimeout: 2h
  tcpCloseWaitTimeout: 30m
  tcpBeLiberal: true
  udpTimeout: 30s
  udpStreamTimeout: 2m
metricsBindAddress: 0.0.0.0:10249
healthzBindAddress: 127.0.0.1:10256
debugBindAddress: 127.0.0.1:6060
enableProfiling: true
serviceTrafficMetrics: true
logging:
  level: debug
  format: console
takeoverKubeProxy: true
serviceLimits:
  virtualServers: 1000
  realServersPerVirtualServer: 2000
  realServers: 3000
  setEntries: 4000
directServerReturn:
  enabled: true
  guePort: 7080
  sloppyTCP: true
`

// everyOptionFlags sets every option on the command line.
var everyOptionFlags = []string{
	"--kubeconfig=/etc/ipvs-proxy/kubeconfig.conf", "--hostname-override=node-7", "--interface=ipvs1",
	"--scheduler=sh", "--scheduler-flags=sh-port", "--nodeport-addresses=10.0.0.0/8", "--service-node-port-range=30000-31000",
	"--external-ip-cidrs=198.51.100.0/24,2001:db8::/64",
	"--exclude-cidrs=10.96.100.0/24", "--ip-families=IPv4", "--route-service-cidrs=true", "--service-cidrs=10.96.0.0/12",
	"--min-sync-period=2s", "--sync-period=1m", "--ipvs-tcp-timeout=15m", "--ipvs-tcpfin-timeout=30s", "--ipvs-udp-timeout=10s",
	"--log-level=debug", "--log-format=console", "--conntrack-max-per-core=0", "--conntrack-min=1000",
	"--conntrack-tcp-timeout-established=2h", "--conntrack-tcp-timeout-close-wait=30m", "--conntrack-tcp-be-liberal",
	"--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=2m", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
	"--masquerade-all", "--iptables-accept-service-traffic", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cni0", "--pod-interface-name-prefix=veth",
	"--iptables-backend=nft", "--strict-arp", "--metrics-bind-address=0.0.0.0:10249", "--healthz-bind-address=127.0.0.1:10256",
	"--debug-bind-address=127.0.0.1:6060", "--profiling", "--service-traffic-metrics", "--takeover-kube-proxy", "--service-max-virtual-servers=1000", "--service-max-real-servers-per-virtual-server=2000",
	"--service-max-real-servers=3000", "--service-max-set-entries=4000", "--direct-server-return", "--gue-port=7080", "--sloppy-tcp",
}

// TestVersionedEqualsFlatAndFlags: an IPVSProxyConfiguration gives the
// same options as the equivalent flat file and flags.
func TestVersionedEqualsFlatAndFlags(t *testing.T) {
	tests := []struct {
		name, flat, versioned string
		flags                 []string
	}{
		{name: "nothing set", versioned: versionedHeader},
		{name: "every option", flat: everyOptionFlat, versioned: everyOptionVersioned, flags: everyOptionFlags},
		{name: "a few options", flat: "scheduler: wrr\nstrictARP: true\nconntrackMin: 0\n",
			versioned: versionedHeader + "ipvs: {scheduler: wrr, strictARP: true}\nconntrack: {min: 0}\n",
			flags:     []string{"--scheduler", "wrr", "--strict-arp", "--conntrack-min", "0"}},
		{name: "null and empty groups keep the defaults", flat: "scheduler: null\nipFamilies: null\n",
			versioned: versionedHeader + "ipvs: null\nconntrack: {}\nipFamilies: null\nlogging: {level: null}\n"},
		{name: "empty lists", flat: "excludeCIDRs: []\nclusterCIDRs: []\n",
			versioned: versionedHeader + "ipvs: {excludeCIDRs: []}\nclusterCIDRs: []\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fromFlat, _, err := resolveWith(t, &tt.flat)
			if err != nil {
				t.Fatalf("flat: %v", err)
			}
			fromVersioned, warn, _, err := resolveWarn(t, &tt.versioned)
			if err != nil {
				t.Fatalf("versioned: %v", err)
			}
			if warn != nil {
				t.Errorf("versioned: warning %s, want none", warn)
			}
			if diff := cmp.Diff(fromFlat, fromVersioned); diff != "" {
				t.Errorf("options (-flat +versioned):\n%s", diff)
			}
			fromFlags, _, err := resolveWith(t, nil, tt.flags...)
			if err != nil {
				t.Fatalf("flags: %v", err)
			}
			if diff := cmp.Diff(fromFlags, fromVersioned, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("options (-flags +versioned):\n%s", diff)
			}
		})
	}
}

// TestVersionedEveryOption: the versioned file sets every option, each at
// the path of its versioned tag; every field of IPVSProxyConfiguration
// is the path of exactly one option.
func TestVersionedEveryOption(t *testing.T) {
	cf, err := decodeConfigFile([]byte(everyOptionVersioned))
	if err != nil {
		t.Fatal(err)
	}
	fields := configFields()
	if diff := cmp.Diff(slices.Sorted(maps.Keys(fields)), cf.keys); diff != "" {
		t.Errorf("options the file sets (-every option +set):\n%s", diff)
	}
	paths := map[string]string{}
	for name, f := range fields {
		if f.path == "" {
			t.Errorf("option %s has no versioned tag", name)
		}
		if other, dup := paths[f.path]; dup {
			t.Errorf("options %s and %s share the path %s", name, other, f.path)
		}
		paths[f.path] = name
		if _, ok := jsonPathType(versionedType, f.path); !ok {
			t.Errorf("option %s: %s is no field of %s", name, f.path, v1alpha1.Kind)
		}
	}
	doc := sampleJSON(versionedType).(map[string]any)
	for _, l := range jsonLeaves("", doc, nil) {
		if _, ok := paths[l.path]; !ok {
			t.Errorf("field %s of %s is no option's path", l.path, v1alpha1.Kind)
		}
	}
}

func TestVersionedErrors(t *testing.T) {
	h := versionedHeader
	testConfigErrors(t, []configErrorCase{
		{"unknown field", h + "mod: ipvs\n", []string{`unknown field "mod" (known: apiVersion, clientConnection, `}, nil},
		{"unknown nested field", h + "ipvs:\n  schedular: rr\n", []string{`unknown field "ipvs.schedular" (did you mean "ipvs.scheduler"?)`}, nil},
		{"a flat key at the top", h + "scheduler: rr\nsyncPeriod: 1m\n", []string{
			`unknown field "scheduler" (IPVSProxyConfiguration has it at "ipvs.scheduler")`,
			`unknown field "syncPeriod" (IPVSProxyConfiguration has it at "ipvs.syncPeriod")`}, nil},
		{"kube-proxy's field, not ipvs-proxy's", h + "clientConnection: {qps: 5}\n", []string{`unknown field "clientConnection.qps" (known: kubeconfig)`}, nil},
		{"unknown fields and bad values", h + "ipvs: {schedular: rr, syncPeriod: 30}\nlogging: {level: 1}\n", []string{
			`3 errors: unknown field "ipvs.schedular" (did you mean "ipvs.scheduler"?); ipvs.syncPeriod: want a duration such as 30s or 1m30s, got a number; logging.level: want a string, got a number`}, nil},
		{"wrong apiVersion", "apiVersion: config.ipvs-proxy.io/v1\nkind: IPVSProxyConfiguration\n",
			[]string{`apiVersion "config.ipvs-proxy.io/v1", kind "IPVSProxyConfiguration" is not a configuration ipvs-proxy reads`, "of kind IPVSProxyConfiguration, apiVersion config.ipvs-proxy.io/v1alpha1"}, nil},
		{"wrong kind", "apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: KubeProxyConfiguration\n",
			[]string{`apiVersion "config.ipvs-proxy.io/v1alpha1", kind "KubeProxyConfiguration" is not a configuration ipvs-proxy reads`}, nil},
		{"no apiVersion", "kind: IPVSProxyConfiguration\n", []string{`apiVersion "", kind "IPVSProxyConfiguration" is not`}, nil},
		{"duplicate field", h + "hostnameOverride: a\nhostnameOverride: b\n", []string{"not valid YAML", `"hostnameOverride" already set`}, nil},
		{"duplicate nested field", h + "ipvs:\n  scheduler: rr\n  scheduler: wrr\n", []string{"not valid YAML", `"scheduler" already set`}, nil},
		{"duplicate group", h + "ipvs: {scheduler: rr}\nipvs: {strictARP: true}\n", []string{"not valid YAML", `"ipvs" already set`}, nil},
		{"a list as a string", h + "ipvs: {excludeCIDRs: 10.0.0.0/8}\n", []string{"ipvs.excludeCIDRs: want a list of strings, got a string"}, nil},
		{"a group as a string", h + "conntrack: fast\n", []string{"conntrack: want a mapping, got a string"}, nil},
		{"an integer too large", h + "conntrack: {min: 99999999999}\n", []string{"conntrack.min: 99999999999 is not an integer that fits in int32"}, nil},
		{"bad duration", h + "ipvs: {udpTimeout: soon}\n", []string{`ipvs.udpTimeout: "soon" is not a duration such as 30s or 1m30s`}, nil},
		{"unknown scheduler", h + "ipvs: {scheduler: fastest}\n", []string{`ipvs.scheduler: unknown IPVS scheduler "fastest"`}, []string{"--scheduler"}},
		{"flags of another scheduler", h + "ipvs: {schedulerFlags: sh-port}\n", []string{`ipvs.schedulerFlags: scheduler flag "sh-port" applies to scheduler "sh", not "rr"`}, nil},
		{"sync periods out of order", h + "ipvs: {minSyncPeriod: 1m, syncPeriod: 10s}\n", []string{"ipvs.minSyncPeriod: --min-sync-period (1m0s) must be between 0 and --sync-period (10s)"}, nil},
		{"bad log format", h + "logging: {format: text}\n", []string{`logging.format: "text" is neither json nor console`}, nil},
		{"bad backend", h + "iptables: {backend: xt}\n", []string{`iptables.backend: "xt" is not auto, nft or legacy`}, nil},
		{"bad detect-local mode", h + "detectLocalMode: BridgeInterface\n", []string{"detectLocalMode: --detect-local-mode BridgeInterface needs --pod-bridge-interface"}, nil},
		{"bad conntrack", h + "conntrack: {min: -1}\n", []string{"conntrack.min: conntrack: maxPerCore (32768) and min (-1) must not be negative"}, nil},
		{"bad bind address", h + "metricsBindAddress: localhost\n", []string{`metricsBindAddress: "localhost" is not host:port`}, nil},
		{"bad debug address", h + "debugBindAddress: ':::10247'\n", []string{`debugBindAddress: ":::10247" is not host:port`}, nil},
	})
}

func TestVersionedPrecedence(t *testing.T) {
	file := versionedHeader + `
ipvs: {scheduler: wrr, syncPeriod: 1m, strictARP: true}
nodePortAddresses: [10.0.0.0/8]
iptables: {masqueradeAll: true}
logging: {level: debug}
`
	tests := []struct {
		name string
		args []string
		want func(o *Options)
	}{
		{name: "the file over the defaults", want: func(*Options) {}},
		{name: "flags over the file", args: []string{"--scheduler", "lc", "--nodeport-addresses", "192.168.0.0/16,172.16.0.0/12", "--masquerade-all=false"},
			want: func(o *Options) {
				o.Scheduler, o.NodePortAddresses, o.MasqueradeAll = "lc", []string{"192.168.0.0/16", "172.16.0.0/12"}, false
			}},
		{name: "a flag set to the default value still wins", args: []string{"--log-level", "info", "--strict-arp=false"},
			want: func(o *Options) { o.LogLevel, o.StrictARP = "info", false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := resolveWith(t, &file, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			checkOptions(t, got, func(o *Options) {
				o.Scheduler, o.SyncPeriod, o.StrictARP = "wrr", time.Minute, true
				o.NodePortAddresses, o.MasqueradeAll, o.LogLevel = []string{"10.0.0.0/8"}, true, "debug"
				tt.want(o)
			})
		})
	}
	// A flag fixes a value the file got wrong.
	bad := versionedHeader + "ipvs: {scheduler: fastest}\n"
	got, _, err := resolveWith(t, &bad, "--scheduler", "sed")
	if err != nil {
		t.Fatal(err)
	}
	checkOptions(t, got, func(o *Options) { o.Scheduler = "sed" })
}

// TestFlatDeprecation: a flat file loads with one warning that names the
// versioned form, logged once and shown by preflight; an empty file, an
// IPVSProxyConfiguration and a KubeProxyConfiguration without ignored
// settings have none.
func TestFlatDeprecation(t *testing.T) {
	file := "scheduler: wrr\nsyncPeriod: 1m\n"
	got, warn, path, err := resolveWarn(t, &file)
	if err != nil {
		t.Fatal(err)
	}
	checkOptions(t, got, func(o *Options) { o.Scheduler, o.SyncPeriod = "wrr", time.Minute })
	if warn == nil {
		t.Fatal("no warning for a flat file")
	}
	want := "config file " + path + ": ipvs-proxy's flat options (no apiVersion and kind) are deprecated: write apiVersion: config.ipvs-proxy.io/v1alpha1, " +
		"kind: IPVSProxyConfiguration, with the options in their groups (ipvs-proxy config convert prints the file so)"
	if diff := cmp.Diff(want, warn.String()); diff != "" {
		t.Errorf("warning (-want +got):\n%s", diff)
	}
	if r := warn.Remedy(); r != "convert the file: ipvs-proxy config convert --config "+path {
		t.Errorf("remedy %q", r)
	}
	core, logs := observer.New(zap.InfoLevel)
	LogWarning(zap.New(core), warn)
	entries := logs.AllUntimed()
	if len(entries) != 1 {
		t.Fatalf("%d entries, want 1", len(entries))
	}
	wantFields := map[string]any{"file": path, "deprecation": warn.Deprecated}
	if diff := cmp.Diff(wantFields, entries[0].ContextMap()); diff != "" || entries[0].Level != zap.WarnLevel {
		t.Errorf("level %s, fields (-want +got):\n%s", entries[0].Level, diff)
	}

	for _, none := range []string{"", "# nothing set\n", versionedHeader + "ipvs: {scheduler: wrr}\n", kubeProxyHeader + "ipvs: {scheduler: wrr}\n"} {
		if _, warn, _, err := resolveWarn(t, &none); err != nil || warn != nil {
			t.Errorf("%q: warning %v, error %v; want neither", none, warn, err)
		}
	}
}

func TestConvert(t *testing.T) {
	got, err := Convert([]byte("# a comment\nscheduler: wrr\nexcludeCIDRs: 10.1.0.0/16, 10.2.0.0/16\nsyncPeriod: 90s\nconntrackMin: 0\n" +
		"kubeconfig: /etc/ipvs-proxy/kubeconfig.conf\nprofiling: true\nmetricsBindAddress: ''\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := versionedHeader + `clientConnection:
  kubeconfig: /etc/ipvs-proxy/kubeconfig.conf
conntrack:
  min: 0
enableProfiling: true
ipvs:
  excludeCIDRs:
  - 10.1.0.0/16
  - 10.2.0.0/16
  scheduler: wrr
  syncPeriod: 1m30s
metricsBindAddress: ""
`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("converted (-want +got):\n%s", diff)
	}
	if got, err := Convert(nil); err != nil || string(got) != versionedHeader {
		t.Errorf("an empty file: %q, %v; want the header alone", got, err)
	}
	for _, tc := range []struct{ name, file, want string }{
		{"already versioned", versionedHeader, "it is of kind IPVSProxyConfiguration, not ipvs-proxy's flat options"},
		{"kube-proxy's", kubeProxyHeader, "it is of kind KubeProxyConfiguration, not ipvs-proxy's flat options"},
		{"a bad flat file", "schedular: rr\n", `unknown field "schedular"`},
	} {
		if _, err := Convert([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.want)
		}
	}
}

// TestConvertRoundTrip: every flat file of the fuzz corpus and the tests
// that decodes converts to an IPVSProxyConfiguration that decodes to the
// same options.
func TestConvertRoundTrip(t *testing.T) {
	files := append(slices.Clone(configFuzzSeeds), everyOptionFlat, "conntrackMaxPerCore: 0\nipFamilies: null\nexcludeCIDRs: ''\n")
	files = append(files, fuzzCorpus(t)...)
	converted := 0
	for _, flat := range files {
		cf, err := decodeConfigFile([]byte(flat))
		if err != nil || cf.kind != "" {
			continue
		}
		out, err := Convert([]byte(flat))
		if err != nil {
			if !yamlCannotWrite(cf.opts, err) {
				t.Errorf("%q: %v", flat, err)
			}
			continue
		}
		back, err := decodeConfigFile(out)
		if err != nil {
			t.Errorf("%q converted does not decode: %v\n%s", flat, err, out)
			continue
		}
		if diff := cmp.Diff(cf.opts, back.opts, cmpopts.EquateEmpty()); diff != "" || back.kind != v1alpha1.Kind || !slices.Equal(cf.keys, back.keys) {
			t.Errorf("%q: kind %s, keys %v, want %v; options (-flat +versioned):\n%s", flat, back.kind, back.keys, cf.keys, diff)
		}
		converted++
	}
	if converted < 8 {
		t.Errorf("only %d files converted", converted)
	}
}

// TestConvertFile: the file's name heads an error.
func TestConvertFile(t *testing.T) {
	file := "scheduler: [rr]\n"
	_, _, path, _ := resolveWarn(t, &file)
	if _, err := ConvertFile(path); err == nil || !strings.HasPrefix(err.Error(), "config file "+path+": scheduler: want a string") {
		t.Errorf("error %v", err)
	}
	if _, err := ConvertFile(path + ".missing"); err == nil || err.Error() != "config file "+path+".missing: no such file or directory" {
		t.Errorf("a missing file: %v", err)
	}
}

// yamlCannotWrite tells whether err may be that of YAML, which refuses
// most of the control characters U+007F to U+009F and turns NEL into a
// line break, writing a string of o that holds one (a flat file may hold
// them escaped).
func yamlCannotWrite(o Options, err error) bool {
	msg := err.Error()
	return (strings.Contains(msg, "control characters are not allowed") || strings.Contains(msg, "reads back as other options")) &&
		strings.ContainsFunc(fmt.Sprint(o), isC1)
}

// fuzzCorpus is the flat files of testdata's FuzzConfigFile corpus.
func fuzzCorpus(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("testdata/fuzz/FuzzConfigFile/*")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		_, arg, _ := strings.Cut(string(b), "\n[]byte(")
		s, err := strconv.Unquote(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(arg), ")")))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, s)
	}
	return out
}

// TestVersionedTypeHasNoMaps: IPVSProxyConfiguration's DeepCopy clones its
// lists by hand; a map or pointer field would need more.
func TestVersionedTypeHasNoMaps(t *testing.T) {
	var walk func(reflect.Type, string)
	walk = func(t2 reflect.Type, path string) {
		for name, ft := range jsonFieldsOf(t2) {
			switch ft.Kind() {
			case reflect.Map, reflect.Pointer, reflect.Interface:
				t.Errorf("%s.%s is a %s", path, name, ft.Kind())
			case reflect.Struct:
				walk(ft, path+"."+name)
			}
		}
	}
	walk(versionedType, v1alpha1.Kind)
}
