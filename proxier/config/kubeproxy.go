package config

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// kube-proxy's own configuration, a KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1; config.conf in the kube-proxy
// ConfigMap that kubeadm writes), is also a config file. It is decoded
// with kube-proxy's types, strictly: an unknown field is an error. The
// fields that mean the same as an option set that option; the other
// fields the file sets are ignored and listed in one warning.
//
// kube-proxy's defaulting is not applied: it is part of kube-proxy, not of
// its config API, and kubeadm writes every field it leaves to it as the
// zero value (0s, "", null). So a zero value means "not set" and leaves
// ipvs-proxy's default, which is kube-proxy's (syncPeriod 30s, scheduler
// rr, healthz on 0.0.0.0:10256, metrics on 127.0.0.1:10249), but for
// ipvs.minSyncPeriod: kube-proxy leaves it 0 (a sync per change),
// ipvs-proxy keeps 1s. Nor is a zero-valued field that ipvs-proxy does not
// support in the warning: it asks for nothing.

const kubeProxyKind = "KubeProxyConfiguration"

var kubeProxyType = reflect.TypeOf(kubeproxyconfig.KubeProxyConfiguration{})

// kubeProxyAPI decodes kube-proxy's config API strictly.
func kubeProxyAPI() (strictAPI, error) {
	return newStrictAPI(kubeProxyKind, kubeProxyType, kubeproxyconfig.AddToScheme)
}

// decodeKubeProxyConfig decodes a KubeProxyConfiguration (data, and j, the
// same as JSON).
func decodeKubeProxyConfig(data, j []byte) (configFile, error) {
	cf := configFile{kind: kubeProxyKind, opts: DefaultOptions(), field: map[string]string{}}
	kp, leaves, err := decodeStrict[*kubeproxyconfig.KubeProxyConfiguration](kubeProxyAPI, data, j)
	if err != nil {
		return cf, err
	}
	cf.fromKubeProxy(kp, leaves)
	return cf, nil
}

// kubeProxyMapping sets options from a KubeProxyConfiguration.
type kubeProxyMapping struct {
	cf *configFile
	// handled are the file's fields that are mapped or judged; the others
	// are ignored when set.
	handled map[string]bool
}

// use records that the file's field path set option key.
func (m *kubeProxyMapping) use(key, path string) {
	m.cf.keys = append(m.cf.keys, key)
	m.cf.field[key] = path
}

// mapValue sets *dst to v, the value of the file's field path, unless v is
// the zero value (not set).
func mapValue[T comparable](m *kubeProxyMapping, key, path string, v T, dst *T) {
	m.handled[path] = true
	var zero T
	if v != zero {
		*dst = v
		m.use(key, path)
	}
}

// mapPtr is mapValue for a field that the file sets when it is not nil,
// whatever its value.
func mapPtr[T any](m *kubeProxyMapping, key, path string, v *T, set func(T)) {
	m.handled[path] = true
	if v != nil {
		set(*v)
		m.use(key, path)
	}
}

// mapList is mapValue for a list.
func mapList(m *kubeProxyMapping, key, path string, v []string, dst *[]string) {
	m.handled[path] = true
	if len(v) > 0 {
		*dst = v
		m.use(key, path)
	}
}

// ignore lists a setting of the file's field path that is not applied.
func (m *kubeProxyMapping) ignore(path, setting string) {
	m.handled[path] = true
	m.cf.ignored = append(m.cf.ignored, setting)
}

// fromKubeProxy sets the options that kp's fields mean, and lists the
// other fields that the file sets (leaves) in cf.ignored.
func (cf *configFile) fromKubeProxy(kp *kubeproxyconfig.KubeProxyConfiguration, leaves []jsonLeaf) {
	m := &kubeProxyMapping{cf: cf, handled: map[string]bool{"apiVersion": true, "kind": true}}
	o := &cf.opts
	mapValue(m, "kubeconfig", "clientConnection.kubeconfig", kp.ClientConnection.Kubeconfig, &o.Kubeconfig)
	mapValue(m, "hostnameOverride", "hostnameOverride", kp.HostnameOverride, &o.HostnameOverride)
	mapList(m, "clusterCIDRs", "clusterCIDR", splitList(kp.ClusterCIDR), &o.ClusterCIDRs)
	mapValue(m, "masqueradeAll", "iptables.masqueradeAll", kp.IPTables.MasqueradeAll, &o.MasqueradeAll) // what kube-proxy's IPVS mode reads
	mapValue(m, "detectLocalMode", "detectLocalMode", string(kp.DetectLocalMode), &o.DetectLocalMode)
	mapValue(m, "podBridgeInterface", "detectLocal.bridgeInterface", kp.DetectLocal.BridgeInterface, &o.PodBridgeInterface)
	mapValue(m, "podInterfaceNamePrefix", "detectLocal.interfaceNamePrefix", kp.DetectLocal.InterfaceNamePrefix, &o.PodInterfaceNamePrefix)
	mapValue(m, "scheduler", "ipvs.scheduler", kp.IPVS.Scheduler, &o.Scheduler)
	mapValue(m, "syncPeriod", "ipvs.syncPeriod", kp.IPVS.SyncPeriod.Duration, &o.SyncPeriod)
	mapValue(m, "minSyncPeriod", "ipvs.minSyncPeriod", kp.IPVS.MinSyncPeriod.Duration, &o.MinSyncPeriod)
	mapList(m, "excludeCIDRs", "ipvs.excludeCIDRs", kp.IPVS.ExcludeCIDRs, &o.ExcludeCIDRs)
	mapValue(m, "strictARP", "ipvs.strictARP", kp.IPVS.StrictARP, &o.StrictARP)
	mapValue(m, "tcpTimeout", "ipvs.tcpTimeout", kp.IPVS.TCPTimeout.Duration, &o.TCPTimeout)
	mapValue(m, "tcpFinTimeout", "ipvs.tcpFinTimeout", kp.IPVS.TCPFinTimeout.Duration, &o.TCPFinTimeout)
	mapValue(m, "udpTimeout", "ipvs.udpTimeout", kp.IPVS.UDPTimeout.Duration, &o.UDPTimeout)
	// Set, even to 0 (leave the kernel's), or not set at all.
	mapPtr(m, "conntrackMaxPerCore", "conntrack.maxPerCore", kp.Conntrack.MaxPerCore, func(v int32) { o.ConntrackMaxPerCore = int(v) })
	mapPtr(m, "conntrackMin", "conntrack.min", kp.Conntrack.Min, func(v int32) { o.ConntrackMin = int(v) })
	mapPtr(m, "conntrackTCPEstablishedTimeout", "conntrack.tcpEstablishedTimeout", kp.Conntrack.TCPEstablishedTimeout,
		func(v metav1.Duration) { o.ConntrackTCPEstablishedTimeout = v.Duration })
	mapPtr(m, "conntrackTCPCloseWaitTimeout", "conntrack.tcpCloseWaitTimeout", kp.Conntrack.TCPCloseWaitTimeout,
		func(v metav1.Duration) { o.ConntrackTCPCloseWaitTimeout = v.Duration })
	mapValue(m, "conntrackTCPBeLiberal", "conntrack.tcpBeLiberal", kp.Conntrack.TCPBeLiberal, &o.ConntrackTCPBeLiberal)
	mapValue(m, "conntrackUDPTimeout", "conntrack.udpTimeout", kp.Conntrack.UDPTimeout.Duration, &o.ConntrackUDPTimeout)
	mapValue(m, "conntrackUDPStreamTimeout", "conntrack.udpStreamTimeout", kp.Conntrack.UDPStreamTimeout.Duration, &o.ConntrackUDPStreamTimeout)
	// kube-proxy takes an IP alone and adds its default port.
	mapValue(m, "metricsBindAddress", "metricsBindAddress", withDefaultPort(kp.MetricsBindAddress, "10249"), &o.MetricsBindAddress)
	mapValue(m, "profiling", "enableProfiling", kp.EnableProfiling, &o.Profiling)
	mapValue(m, "healthzBindAddress", "healthzBindAddress", withDefaultPort(kp.HealthzBindAddress, "10256"), &o.HealthzBindAddress)

	// Fields that ipvs-proxy follows for some values only.
	if slices.Contains(kp.NodePortAddresses, "primary") {
		m.ignore("nodePortAddresses", "nodePortAddresses: primary (node ports are served on every node address but loopback; list CIDRs to narrow that)")
	} else {
		mapList(m, "nodePortAddresses", "nodePortAddresses", kp.NodePortAddresses, &o.NodePortAddresses)
	}
	switch kp.Logging.Format {
	case "json":
		mapValue(m, "logFormat", "logging.format", "json", &o.LogFormat)
	case "text":
		mapValue(m, "logFormat", "logging.format", "console", &o.LogFormat)
	}
	m.handled["mode"], m.handled["bindAddress"] = true, true
	if kp.Mode != "" && kp.Mode != "ipvs" {
		m.ignore("mode", fmt.Sprintf("mode: %s (ipvs-proxy programs IPVS whatever the mode)", kp.Mode))
	}
	switch kp.BindAddress {
	case "", "0.0.0.0", "::": // what kubeadm writes: nothing asked
	default:
		m.ignore("bindAddress", "bindAddress: "+kp.BindAddress)
	}

	// Every other field the file sets.
	for _, l := range leaves {
		if !m.handled[l.path] && !zeroJSON(l.value) {
			cf.ignored = append(cf.ignored, l.path+": "+jsonText(l.value))
		}
	}
	slices.Sort(cf.ignored)
}

// withDefaultPort adds port to an address that is an IP alone.
func withDefaultPort(addr, port string) string {
	host := strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
	if net.ParseIP(host) != nil {
		return net.JoinHostPort(host, port)
	}
	return addr
}

// zeroJSON tells whether a JSON value is a zero value (null, false, 0, "",
// a zero duration or quantity, an empty list or mapping): how kubeadm
// writes a field it leaves to kube-proxy's default.
func zeroJSON(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case float64:
		return v == 0
	case string:
		d, err := time.ParseDuration(v)
		return v == "" || (err == nil && d == 0)
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

// jsonText writes a JSON value for a message: a string as it is.
func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
