package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
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

// kubeProxyDecoder decodes kube-proxy's config API strictly (unknown and
// duplicate fields are errors), without conversion or defaulting.
func kubeProxyDecoder() (runtime.Decoder, error) {
	scheme := runtime.NewScheme()
	if err := kubeproxyconfig.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register kube-proxy's config API: %w", err)
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer(), nil
}

// decodeKubeProxyConfig decodes a config file that has an apiVersion or a
// kind (data, and j, the same as JSON): it must be a KubeProxyConfiguration.
func decodeKubeProxyConfig(data, j []byte) (configFile, error) {
	cf := configFile{kind: kubeProxyKind, opts: DefaultOptions(), field: map[string]string{}}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return cf, fmt.Errorf("apiVersion and kind must be strings: %w", err)
	}
	want := kubeproxyconfig.SchemeGroupVersion.WithKind(kubeProxyKind)
	if tm.GroupVersionKind() != want {
		return cf, fmt.Errorf("apiVersion %q, kind %q is not a configuration ipvs-proxy reads: that is kind %s, apiVersion %s, or ipvs-proxy's own options, without apiVersion and kind",
			tm.APIVersion, tm.Kind, want.Kind, want.GroupVersion())
	}
	var tree map[string]any
	if err := json.Unmarshal(j, &tree); err != nil {
		return cf, fmt.Errorf("read %s: %w", kubeProxyKind, err)
	}
	leaves := jsonLeaves("", tree, nil)
	dec, err := kubeProxyDecoder()
	if err != nil {
		return cf, err
	}
	obj, _, err := dec.Decode(data, nil, nil)
	if err != nil {
		return cf, kubeProxyDecodeError(dec, err, leaves)
	}
	kp, ok := obj.(*kubeproxyconfig.KubeProxyConfiguration)
	if !ok {
		return cf, fmt.Errorf("decoded a %T, not a %s", obj, kubeProxyKind)
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

// jsonLeaf is a value in a JSON document that is not a non-empty mapping,
// with its dotted path.
type jsonLeaf struct {
	path  string
	value any
}

// jsonLeaves appends the leaves of v, under prefix, to out, in order.
func jsonLeaves(prefix string, v any, out []jsonLeaf) []jsonLeaf {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return append(out, jsonLeaf{path: prefix, value: v})
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		out = jsonLeaves(p, m[k], out)
	}
	return out
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

var unknownFieldError = regexp.MustCompile(`^unknown field "(.+)"$`)

// kubeProxyDecodeError turns an error of the decoder into one that names
// the fields at fault: the unknown fields, then the values that do not
// decode (the decoder stops at the first of those, without a name when
// the value's own decoding fails).
func kubeProxyDecodeError(dec runtime.Decoder, err error, leaves []jsonLeaf) error {
	var valueErrs []error
	if _, ok := runtime.AsStrictDecodingError(err); !ok {
		var good []jsonLeaf
		valueErrs, good = kubeProxyValueErrors(leaves)
		if len(valueErrs) == 0 {
			return fmt.Errorf("decode %s: %w", kubeProxyKind, err)
		}
		// Decode the rest again for its unknown fields.
		rest, merr := json.Marshal(jsonDoc(good))
		if merr != nil {
			return joinErrors(valueErrs)
		}
		_, _, err = dec.Decode(rest, nil, nil)
	}
	var errs []error
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		for _, e := range strict.Errors() {
			errs = append(errs, describeUnknownField(e))
		}
	}
	return joinErrors(append(errs, valueErrs...))
}

// jsonDoc is the JSON document of leaves.
func jsonDoc(leaves []jsonLeaf) map[string]any {
	doc := map[string]any{}
	for _, l := range leaves {
		m := doc
		parts := strings.Split(l.path, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = l.value
	}
	return doc
}

// describeUnknownField adds the field that was probably meant to an
// unknown field error of the strict decoder.
func describeUnknownField(err error) error {
	match := unknownFieldError.FindStringSubmatch(err.Error())
	if match == nil {
		return err
	}
	parent, name, prefix := "", match[1], ""
	if i := strings.LastIndex(name, "."); i >= 0 {
		parent, name, prefix = name[:i], name[i+1:], name[:i+1]
	}
	t := kubeProxyType
	if parent != "" {
		var ok bool
		if t, ok = jsonPathType(t, parent); !ok {
			return err
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return err
	}
	return unknownField(prefix, name, slices.Collect(maps.Keys(jsonFieldsOf(t))))
}

// kubeProxyValueErrors finds the leaves whose values do not decode, each
// alone, to name them; good are the others.
func kubeProxyValueErrors(leaves []jsonLeaf) (errs []error, good []jsonLeaf) {
	for _, l := range leaves {
		b, err := json.Marshal(jsonDoc([]jsonLeaf{l}))
		if err != nil {
			continue
		}
		var kp kubeproxyconfig.KubeProxyConfiguration
		if err = json.Unmarshal(b, &kp); err == nil {
			good = append(good, l)
			continue
		}
		t, ok := jsonPathType(kubeProxyType, l.path)
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %w", l.path, err))
			continue
		}
		raw, _ := json.Marshal(l.value)
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
			errs = append(errs, fmt.Errorf("%s: want %s, got %s", l.path, describeType(t), jsonKind(raw)))
		} else {
			errs = append(errs, fmt.Errorf("%s: %s is not %s", l.path, raw, describeType(t)))
		}
	}
	return errs, good
}

// jsonFieldsOf maps the json names of a struct's fields, with those of
// inlined structs, to their types.
func jsonFieldsOf(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			maps.Copy(out, jsonFieldsOf(f.Type))
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}

// jsonPathType is the type of the value at a dotted path ("ipvs.scheduler",
// "logging.vmodule[0]") in a value of type t.
func jsonPathType(t reflect.Type, path string) (reflect.Type, bool) {
	for _, seg := range strings.Split(path, ".") {
		name, _, indexed := strings.Cut(seg, "[")
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			ft, ok := jsonFieldsOf(t)[name]
			if !ok {
				return nil, false
			}
			t = ft
		case reflect.Map:
			t = t.Elem()
		default:
			return nil, false
		}
		if indexed {
			if t.Kind() != reflect.Slice {
				return nil, false
			}
			t = t.Elem()
		}
	}
	return t, true
}
