package config

import (
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

const kubeProxyHeader = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// TestKubeProxyConfigKubeadm: the config.conf of kube-proxy's ConfigMap as
// kubeadm writes it, with the DaemonSet's flag, gives its settings and no
// warning; its kubeconfig.conf needs only the pod's service account.
func TestKubeProxyConfigKubeadm(t *testing.T) {
	b, err := os.ReadFile("testdata/kube-proxy-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(b, &cm); err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["config.conf"]
	got, warn, _, err := resolveWarn(t, &conf, "--hostname-override", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	checkOptions(t, got, func(o *Options) {
		o.Kubeconfig, o.HostnameOverride = "/var/lib/kube-proxy/kubeconfig.conf", "node-1"
		o.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
		o.Scheduler, o.StrictARP = "lc", true
		o.ExcludeCIDRs = []string{"192.0.2.0/24"}
		o.TCPTimeout = 15 * time.Minute
	})
	if warn != nil {
		t.Errorf("warning %s, want none", warn)
	}

	kc, err := clientcmd.Load([]byte(cm.Data["kubeconfig.conf"]))
	if err != nil {
		t.Fatal(err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.AuthInfos[ctx.AuthInfo] == nil || kc.Clusters[ctx.Cluster] == nil {
		t.Fatalf("kubeconfig.conf: incomplete current context %q", kc.CurrentContext)
	}
	if tf, ca := kc.AuthInfos[ctx.AuthInfo].TokenFile, kc.Clusters[ctx.Cluster].CertificateAuthority; tf != "/var/run/secrets/kubernetes.io/serviceaccount/token" ||
		ca != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" {
		t.Errorf("kubeconfig.conf: token %q, CA %q; want the pod's service account's", tf, ca)
	}
}

func TestKubeProxyConfig(t *testing.T) {
	tests := []struct {
		name    string
		file    string // after the apiVersion and kind
		args    []string
		want    func(o *Options) // changes the defaults into what is expected
		ignored []string         // the warning's list; nil: no warning
	}{
		{name: "nothing set", file: "", want: func(*Options) {}},
		{name: "every field that maps", file: `
clientConnection: {kubeconfig: /etc/kubernetes/proxy.conf}
hostnameOverride: node-7
clusterCIDR: "10.244.0.0/16, fd00:10:244::/56"
nodePortAddresses: [10.0.0.0/8, 2001:db8::/64]
iptables: {masqueradeAll: true}
ipvs:
  scheduler: sh
  syncPeriod: 1m
  minSyncPeriod: 5s
  excludeCIDRs: [10.96.100.0/24]
  strictARP: true
  tcpTimeout: 15m
  tcpFinTimeout: 30s
  udpTimeout: 10s
metricsBindAddress: 0.0.0.0:10249
healthzBindAddress: 127.0.0.1:10256
logging: {format: text}
mode: ipvs
detectLocalMode: ClusterCIDR
bindAddress: "::"
`, want: func(o *Options) {
			o.Kubeconfig, o.HostnameOverride = "/etc/kubernetes/proxy.conf", "node-7"
			o.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
			o.NodePortAddresses = []string{"10.0.0.0/8", "2001:db8::/64"}
			o.MasqueradeAll, o.StrictARP = true, true
			o.Scheduler, o.SyncPeriod, o.MinSyncPeriod = "sh", time.Minute, 5*time.Second
			o.ExcludeCIDRs = []string{"10.96.100.0/24"}
			o.TCPTimeout, o.TCPFinTimeout, o.UDPTimeout = 15*time.Minute, 30*time.Second, 10*time.Second
			o.MetricsBindAddress, o.HealthzBindAddress = "0.0.0.0:10249", "127.0.0.1:10256"
			o.LogFormat = "console"
			o.DetectLocalMode = "ClusterCIDR"
		}},
		{name: "detectLocalMode BridgeInterface", file: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			want: func(o *Options) { o.DetectLocalMode, o.PodBridgeInterface = "BridgeInterface", "cbr0" }},
		{name: "detectLocalMode NodeCIDR", file: "detectLocalMode: NodeCIDR\n",
			want: func(o *Options) { o.DetectLocalMode = "NodeCIDR" }},
		{name: "zero values are not set", file: `
clientConnection: {kubeconfig: "", qps: 0, burst: 0}
ipvs: {scheduler: "", syncPeriod: 0s, minSyncPeriod: 0s, excludeCIDRs: null, strictARP: false}
metricsBindAddress: ""
nodePortAddresses: []
conntrack: {maxPerCore: null, min: 0, udpTimeout: 0s}
oomScoreAdj: null
featureGates: {}
`, want: func(o *Options) {
			o.ConntrackMin = 0 // a pointer in kube-proxy's type: set, to 0
		}},
		{name: "conntrack", file: "conntrack: {maxPerCore: 0, min: 1000, tcpEstablishedTimeout: 2h, tcpCloseWaitTimeout: 0s, tcpBeLiberal: true, udpTimeout: 30s, udpStreamTimeout: 2m}\n",
			want: func(o *Options) {
				o.ConntrackMaxPerCore, o.ConntrackMin = 0, 1000 // 0: leave the kernel's limit
				o.ConntrackTCPEstablishedTimeout, o.ConntrackTCPCloseWaitTimeout = 2*time.Hour, 0
				o.ConntrackTCPBeLiberal, o.ConntrackUDPTimeout, o.ConntrackUDPStreamTimeout = true, 30*time.Second, 2*time.Minute
			}},
		{name: "addresses without a port get kube-proxy's", file: "metricsBindAddress: 0.0.0.0\nhealthzBindAddress: \"::\"\n",
			want: func(o *Options) { o.MetricsBindAddress, o.HealthzBindAddress = "0.0.0.0:10249", "[::]:10256" }},
		{name: "mode iptables is a warning", file: "mode: iptables\n", want: func(*Options) {},
			ignored: []string{"mode: iptables (ipvs-proxy programs IPVS whatever the mode)"}},
		{name: "nodePortAddresses primary is a warning", file: "nodePortAddresses: [primary]\n", want: func(*Options) {},
			ignored: []string{"nodePortAddresses: primary (node ports are served on every node address but loopback; list CIDRs to narrow that)"}},
		{name: "unsupported settings in one warning", file: `
mode: nftables
featureGates: {SomeGate: true}
clientConnection: {qps: 5, burst: 10, contentType: application/vnd.kubernetes.protobuf}
bindAddress: 192.0.2.7
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: "1.35"
iptables: {masqueradeBit: 14, syncPeriod: 30s, localhostNodePorts: true}
nftables: {masqueradeAll: true, minSyncPeriod: 1s}
conntrack: {maxPerCore: 32768, tcpEstablishedTimeout: 24h}
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: veth}
winkernel: {enableDSR: true}
logging: {verbosity: 4}
oomScoreAdj: -999
configSyncPeriod: 15m
portRange: 30000-32767
ipvs: {scheduler: wrr}
`, want: func(o *Options) {
			o.Scheduler, o.Profiling = "wrr", true
			o.DetectLocalMode, o.PodInterfaceNamePrefix = "InterfaceNamePrefix", "veth"
		}, ignored: []string{
			"bindAddress: 192.0.2.7",
			"bindAddressHardFail: true",
			"clientConnection.burst: 10",
			"clientConnection.contentType: application/vnd.kubernetes.protobuf",
			"clientConnection.qps: 5",
			"configSyncPeriod: 15m",
			"featureGates.SomeGate: true",
			"iptables.localhostNodePorts: true",
			"iptables.masqueradeBit: 14",
			"iptables.syncPeriod: 30s",
			"logging.verbosity: 4",
			"mode: nftables (ipvs-proxy programs IPVS whatever the mode)",
			"nftables.masqueradeAll: true",
			"nftables.minSyncPeriod: 1s",
			"oomScoreAdj: -999",
			"portRange: 30000-32767",
			"showHiddenMetricsForVersion: 1.35",
			"winkernel.enableDSR: true",
		}},
		{name: "flags override the file", file: `
hostnameOverride: from-file
clusterCIDR: 10.244.0.0/16
ipvs: {scheduler: sh, syncPeriod: 1m, strictARP: true}
metricsBindAddress: 0.0.0.0:10249
`, args: []string{"--hostname-override", "node-1", "--scheduler", "mh", "--cluster-cidr", "10.0.0.0/8,fd00::/48", "--strict-arp=false", "--metrics-bind-address", ""},
			want: func(o *Options) {
				o.HostnameOverride, o.Scheduler, o.SyncPeriod = "node-1", "mh", time.Minute
				o.ClusterCIDRs, o.MetricsBindAddress = []string{"10.0.0.0/8", "fd00::/48"}, ""
			}},
		{name: "a flag fixes a value the file got wrong", file: "ipvs: {scheduler: fastest}\n", args: []string{"--scheduler", "lc"},
			want: func(o *Options) { o.Scheduler = "lc" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := kubeProxyHeader + tt.file
			got, warn, path, err := resolveWarn(t, &file, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			checkOptions(t, got, tt.want)
			var ignored []string
			if warn != nil {
				ignored = warn.Ignored
				if warn.File != path || warn.Kind != "KubeProxyConfiguration" {
					t.Errorf("warning of file %q kind %q, want %q KubeProxyConfiguration", warn.File, warn.Kind, path)
				}
			}
			if diff := cmp.Diff(tt.ignored, ignored); diff != "" {
				t.Errorf("ignored settings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKubeProxyConfigWarningText(t *testing.T) {
	file := kubeProxyHeader + "mode: iptables\noomScoreAdj: -999\n"
	_, warn, path, err := resolveWarn(t, &file)
	if err != nil {
		t.Fatal(err)
	}
	want := "config file " + path + " (KubeProxyConfiguration): ipvs-proxy ignores 2 setting(s) it does not support: " +
		"mode: iptables (ipvs-proxy programs IPVS whatever the mode); oomScoreAdj: -999"
	if warn == nil || warn.String() != want {
		t.Errorf("warning %v,\nwant %s", warn, want)
	}
}

// TestKubeProxyConfigWarningLogged: run logs the warning once, with the
// file and every ignored setting; nothing without one.
func TestKubeProxyConfigWarningLogged(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	LogWarning(zap.New(core), nil)
	if n := logs.Len(); n != 0 {
		t.Errorf("%d entries without a warning", n)
	}
	warn := &Warning{File: "/var/lib/kube-proxy/config.conf", Kind: "KubeProxyConfiguration", Ignored: []string{"mode: iptables", "oomScoreAdj: -999"}}
	LogWarning(zap.New(core), warn)
	entries := logs.AllUntimed()
	if len(entries) != 1 {
		t.Fatalf("%d entries, want 1", len(entries))
	}
	e := entries[0]
	want := map[string]any{"file": "/var/lib/kube-proxy/config.conf", "kind": "KubeProxyConfiguration", "ignored": []any{"mode: iptables", "oomScoreAdj: -999"}}
	if diff := cmp.Diff(want, e.ContextMap()); diff != "" || e.Level != zap.WarnLevel {
		t.Errorf("level %s, fields (-want +got):\n%s", e.Level, diff)
	}
}

func TestKubeProxyConfigErrors(t *testing.T) {
	testConfigErrors(t, []configErrorCase{
		{"unknown field", kubeProxyHeader + "mod: ipvs\n", []string{`unknown field "mod" (did you mean "mode"?)`}, nil},
		{"unknown nested field", kubeProxyHeader + "ipvs:\n  schedular: rr\n", []string{`unknown field "ipvs.schedular" (did you mean "ipvs.scheduler"?)`}, nil},
		{"unknown field, far from any", kubeProxyHeader + "ipvs: {frobnicate: 1}\n",
			[]string{`unknown field "ipvs.frobnicate" (known: excludeCIDRs, minSyncPeriod, scheduler, strictARP, syncPeriod, tcpFinTimeout, tcpTimeout, udpTimeout)`}, nil},
		{"several unknown fields", kubeProxyHeader + "mod: ipvs\nipvs: {schedular: rr}\n",
			[]string{`2 errors: unknown field "ipvs.schedular" (did you mean "ipvs.scheduler"?); unknown field "mod" (did you mean "mode"?)`}, nil},
		{"unknown fields and bad values", kubeProxyHeader + "mod: ipvs\nipvs: {schedular: rr, syncPeriod: 30, udpTimeout: soon}\n",
			[]string{`4 errors: unknown field "ipvs.schedular" (did you mean "ipvs.scheduler"?); unknown field "mod" (did you mean "mode"?); ` +
				`ipvs.syncPeriod: want a duration such as 30s or 1m30s, got a number; ipvs.udpTimeout: "soon" is not a duration such as 30s or 1m30s`}, nil},
		{"duplicate field", kubeProxyHeader + "mode: ipvs\nmode: iptables\n", []string{"not valid YAML", `"mode" already set`}, nil},
		{"duration as a number", kubeProxyHeader + "ipvs: {syncPeriod: 30}\n", []string{"ipvs.syncPeriod: want a duration such as 30s or 1m30s, got a number"}, nil},
		{"bad duration", kubeProxyHeader + "ipvs: {syncPeriod: soon}\n", []string{`ipvs.syncPeriod: "soon" is not a duration such as 30s or 1m30s`}, nil},
		{"bool of the wrong type", kubeProxyHeader + "ipvs: {strictARP: sometimes}\n", []string{"ipvs.strictARP: want true or false, got a string"}, nil},
		{"a section of the wrong type", kubeProxyHeader + "ipvs: 5\n", []string{"ipvs: want a mapping, got a number"}, nil},
		{"a list of the wrong type", kubeProxyHeader + "nodePortAddresses: 10.0.0.0/8\n", []string{"nodePortAddresses: want a list of strings, got a string"}, nil},
		{"unknown scheduler", kubeProxyHeader + "ipvs: {scheduler: fastest}\n", []string{`ipvs.scheduler: unknown IPVS scheduler "fastest"`}, []string{"--scheduler"}},
		{"bad cluster CIDR", kubeProxyHeader + "clusterCIDR: 10.244.0.0/16,pods\n", []string{`clusterCIDR: "pods" is not a CIDR`}, nil},
		{"bad node port address", kubeProxyHeader + "nodePortAddresses: [10.0.0.1]\n", []string{`nodePortAddresses: "10.0.0.1" is not a CIDR`}, nil},
		{"bad bind address", kubeProxyHeader + "metricsBindAddress: localhost\n", []string{`metricsBindAddress: "localhost" is not host:port`}, nil},
		{"bad timeout", kubeProxyHeader + "ipvs: {udpTimeout: 100ms}\n", []string{"ipvs.udpTimeout: 100ms must be 0 or at least 1s"}, nil},
		{"another version", "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
			[]string{`apiVersion "kubeproxy.config.k8s.io/v1alpha2", kind "KubeProxyConfiguration" is not a configuration ipvs-proxy reads: that is kind KubeProxyConfiguration, apiVersion kubeproxy.config.k8s.io/v1alpha1, or ipvs-proxy's own options, without apiVersion and kind`}, nil},
		{"another kind", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
			[]string{`apiVersion "kubelet.config.k8s.io/v1beta1", kind "KubeletConfiguration" is not a configuration ipvs-proxy reads`}, nil},
		{"a kind without apiVersion", "kind: KubeProxyConfiguration\nmode: ipvs\n", []string{`apiVersion "", kind "KubeProxyConfiguration" is not`}, nil},
		{"own options with a kind", "kind: ipvs-proxy\nscheduler: rr\n", []string{`apiVersion "", kind "ipvs-proxy" is not`}, nil},
		{"kind not a string", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: [KubeProxyConfiguration]\n", []string{"apiVersion and kind must be strings"}, nil},
	})
}

// TestKubeProxyConfigEveryField: every field of a KubeProxyConfiguration,
// set, either sets an option or is in the warning; exactly one. A field
// that a new kube-proxy adds lands in the warning by itself.
func TestKubeProxyConfigEveryField(t *testing.T) {
	doc := sampleJSON(kubeProxyType).(map[string]any)
	doc["apiVersion"], doc["kind"] = "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := decodeConfigFile(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	mapped := slices.Collect(maps.Values(cf.field))
	leaves := jsonLeaves("", doc, nil)
	if len(leaves) < 50 {
		t.Fatalf("only %d fields sampled", len(leaves))
	}
	for _, l := range leaves {
		if l.path == "apiVersion" || l.path == "kind" {
			continue
		}
		isMapped := slices.Contains(mapped, l.path)
		isIgnored := slices.ContainsFunc(cf.ignored, func(s string) bool { return strings.HasPrefix(s, l.path+": ") })
		if isMapped == isIgnored {
			t.Errorf("%s = %v: mapped %v, ignored %v; want exactly one", l.path, l.value, isMapped, isIgnored)
		}
	}
	for _, p := range mapped {
		if !slices.ContainsFunc(leaves, func(l jsonLeaf) bool { return l.path == p }) {
			t.Errorf("an option is set by %q, which is no field", p)
		}
	}
	if len(cf.keys) != len(cf.field) {
		t.Errorf("%d options set by %d fields", len(cf.keys), len(cf.field))
	}
}

// sampleJSON is a value of type t, as JSON, with every field set to
// something other than its zero value.
func sampleJSON(t reflect.Type) any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == metaDurationType || t.Name() == "TimeOrMetaDuration":
		return "1s"
	case reflect.PointerTo(t).Implements(jsonUnmarshalerType):
		return "1" // a quantity
	}
	switch t.Kind() {
	case reflect.Struct:
		out := map[string]any{}
		for name, ft := range jsonFieldsOf(t) {
			if name != "apiVersion" && name != "kind" {
				out[name] = sampleJSON(ft)
			}
		}
		return out
	case reflect.Map:
		return map[string]any{"x": sampleJSON(t.Elem())}
	case reflect.Slice:
		return []any{sampleJSON(t.Elem())}
	case reflect.String:
		return "x"
	case reflect.Bool:
		return true
	}
	return 1
}
