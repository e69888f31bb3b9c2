package main

// Checks of deploy/ against the command itself: the ConfigMap's config
// file loads and names every option, and the DaemonSet's commands parse.
// (e2e/deploy_test.go applies the manifests to a real apiserver.)

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
)

func readManifest(t *testing.T, name string, into any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
}

func TestDeployConfigMap(t *testing.T) {
	var cm corev1.ConfigMap
	readManifest(t, "configmap.yaml", &cm)
	cfgYAML, kubeconfig := cm.Data["config.yaml"], cm.Data["kubeconfig.conf"]
	if cfgYAML == "" || kubeconfig == "" {
		t.Fatalf("ConfigMap keys %v, want config.yaml and kubeconfig.conf", slices.Sorted(maps.Keys(cm.Data)))
	}

	// An IPVSProxyConfiguration that spells out every option, at its path.
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(cfgYAML), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["apiVersion"] != "config.ipvs-proxy.io/v1alpha1" || doc["kind"] != "IPVSProxyConfiguration" {
		t.Errorf("config.yaml is apiVersion %v, kind %v; want an IPVSProxyConfiguration", doc["apiVersion"], doc["kind"])
	}
	typ := reflect.TypeOf(config.Options{})
	for i := range typ.NumField() {
		path := typ.Field(i).Tag.Get("versioned")
		if !hasPath(doc, path) && path != "hostnameOverride" {
			t.Errorf("config.yaml does not set %q (option %s)", path, typ.Field(i).Name)
		}
	}

	// It loads with `run --config` and differs from the defaults only in
	// the kubeconfig.
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfgYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := &cobra.Command{Use: "run"}
	of := config.NewFlags(cmd.Flags())
	if err := cmd.Flags().Parse([]string{"--config", path, "--hostname-override", "node-1"}); err != nil {
		t.Fatal(err)
	}
	o, warn, err := of.Resolve()
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml: %v", err)
	}
	if warn != nil {
		t.Errorf("the ConfigMap's config.yaml: warning %s", warn)
	}
	want := config.DefaultOptions()
	want.Kubeconfig = "/etc/ipvs-proxy/kubeconfig.conf"
	want.HostnameOverride = "node-1"
	got := *o
	for _, s := range []*[]string{&got.NodePortAddresses, &got.ExternalIPCIDRs, &got.ExcludeCIDRs, &got.ClusterCIDRs, &got.ServiceCIDRs} {
		if len(*s) == 0 {
			*s = nil
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config.yaml gives\n%+v\nwant the defaults\n%+v", got, want)
	}

	kc, err := clientcmd.Load([]byte(kubeconfig))
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.AuthInfos[ctx.AuthInfo] == nil || kc.Clusters[ctx.Cluster] == nil {
		t.Fatalf("kubeconfig.conf: incomplete current context %q", kc.CurrentContext)
	}
	if tf := kc.AuthInfos[ctx.AuthInfo].TokenFile; tf != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("kubeconfig.conf token file %q, want the pod's service account token", tf)
	}
}

// hasPath tells whether the YAML document doc has a value at the dotted
// path ("ipvs.scheduler").
func hasPath(doc map[string]any, path string) bool {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := doc[p].(map[string]any)
		if !ok {
			return false
		}
		doc = next
	}
	_, ok := doc[parts[len(parts)-1]]
	return ok
}

// TestDeployDaemonSet checks what the issue asks of the DaemonSet, and
// that its commands are ones this binary accepts.
func TestDeployDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	readManifest(t, "daemonset.yaml", &ds)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" || spec.ServiceAccountName != "ipvs-proxy" {
		t.Errorf("hostNetwork %v priorityClassName %q serviceAccountName %q", spec.HostNetwork, spec.PriorityClassName, spec.ServiceAccountName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want one that tolerates everything", spec.Tolerations)
	}
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("%d init containers, %d containers; want 1 and 1", len(spec.InitContainers), len(spec.Containers))
	}
	// The runtime's default seccomp profile for both containers (the
	// kubelet's default is Unconfined).
	if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v, want seccompProfile RuntimeDefault", psc)
	}
	mounts := func(c corev1.Container) map[string]corev1.VolumeMount {
		m := map[string]corev1.VolumeMount{}
		for _, vm := range c.VolumeMounts {
			m[vm.MountPath] = vm
		}
		return m
	}
	caps := func(c corev1.Container) []string {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("%s: privileged or no capabilities", c.Name)
			return nil
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s drops %v, want ALL", c.Name, sc.Capabilities.Drop)
		}
		var out []string
		for _, c := range sc.Capabilities.Add {
			out = append(out, string(c))
		}
		slices.Sort(out)
		return out
	}

	pre, agent := spec.InitContainers[0], spec.Containers[0]
	if got := caps(pre); !slices.Equal(got, []string{"NET_ADMIN", "NET_RAW", "SYS_MODULE"}) {
		t.Errorf("preflight capabilities %v", got)
	}
	if got := caps(agent); !slices.Equal(got, []string{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("run capabilities %v", got)
	}
	if m, ok := mounts(pre)["/lib/modules"]; !ok || !m.ReadOnly {
		t.Errorf("preflight: /lib/modules not mounted read-only: %+v", m)
	}
	if _, ok := mounts(agent)["/lib/modules"]; ok {
		t.Error("run mounts /lib/modules: only preflight loads modules")
	}
	for _, c := range []corev1.Container{pre, agent} {
		if _, ok := mounts(c)[sysctls.HostProcSys+"/net"]; !ok {
			t.Errorf("%s: the node's /proc/sys/net is not at %s/net", c.Name, sysctls.HostProcSys)
		}
	}

	// The commands parse: the subcommand exists and takes these flags.
	for _, c := range []struct {
		container corev1.Container
		sub       string
		cmd       *cobra.Command
	}{{pre, "preflight", newPreflightCommand()}, {agent, "run", newRunCommand()}} {
		argv := c.container.Command
		if len(argv) < 2 || argv[0] != "/usr/local/bin/ipvs-proxy" || argv[1] != c.sub {
			t.Errorf("%s: command %q, want /usr/local/bin/ipvs-proxy %s ...", c.container.Name, argv, c.sub)
			continue
		}
		if err := c.cmd.ParseFlags(argv[2:]); err != nil {
			t.Errorf("%s: %q: %v", c.container.Name, argv, err)
		}
	}
	var probes []string
	for _, p := range []*corev1.Probe{agent.StartupProbe, agent.LivenessProbe, agent.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatal("run: startup, liveness and readiness probes over HTTP wanted")
		}
		probes = append(probes, p.HTTPGet.Host+":"+p.HTTPGet.Port.String()+p.HTTPGet.Path)
	}
	// 127.0.0.1, not the pod's IP: a host-network pod's is the node's
	// address at its start, gone once the node is renumbered.
	if want := []string{"127.0.0.1:10256/livez", "127.0.0.1:10256/livez", "127.0.0.1:10256/healthz"}; !slices.Equal(probes, want) {
		t.Errorf("probes %v, want %v", probes, want)
	}
	livenessWindows(t, agent.LivenessProbe)
}

// livenessWindows: the liveness probe restarts an agent whose loop has
// stalled (/livez answers 503 at once) within 2 minutes of the handler's
// own verdict, but one that a starved node leaves unanswered only after 3
// minutes of silence. kubelet asks a container's probe one at a time, so
// failureThreshold unanswered probes take failureThreshold × max(timeout,
// period). With 5 s timeouts, a soak at 2,000 Services on the emulated
// bed (issue 45's case 8) had node-1's agent killed for six slow answers,
// and the swamped node did not start it again for over 20 minutes; a
// restart never gives a starved agent CPU, and its cold start adds load.
func livenessWindows(t *testing.T, p *corev1.Probe) {
	t.Helper()
	secs := func(n int32) time.Duration { return time.Duration(n) * time.Second }
	answered := time.Duration(p.FailureThreshold) * secs(p.PeriodSeconds)
	silent := time.Duration(p.FailureThreshold) * max(secs(p.TimeoutSeconds), secs(p.PeriodSeconds))
	if answered > 2*time.Minute || silent < 3*time.Minute {
		t.Errorf("liveness probe (period %ds, timeout %ds, %d failures): restarts a stalled loop after %s (want at most 2m0s), "+
			"a silent agent after %s (want at least 3m0s)", p.PeriodSeconds, p.TimeoutSeconds, p.FailureThreshold, answered, silent)
	}
}

// TestDeployKubeProxyConfigMap applies deploy/README.md's patch that points the
// DaemonSet at kube-proxy's ConfigMap: both containers mount it where
// kube-proxy's pod does (where its kubeconfig points) and read its
// config.conf with --config.
func TestDeployKubeProxyConfigMap(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start = "kubectl -n kube-system patch ds ipvs-proxy --type json -p '"
	_, rest, ok := strings.Cut(string(readme), start)
	patchJSON, _, ok2 := strings.Cut(rest, "'\n")
	if !ok || !ok2 {
		t.Fatalf("README: no %q...' command", start)
	}
	patch, err := jsonpatch.DecodePatch([]byte(patchJSON))
	if err != nil {
		t.Fatalf("README's patch: %v", err)
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	if doc, err = patch.Apply(doc); err != nil {
		t.Fatalf("README's patch on deploy/daemonset.yaml: %v", err)
	}
	var ds, orig appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(doc, &ds); err != nil {
		t.Fatal(err)
	}
	readManifest(t, "daemonset.yaml", &orig)

	// Where kube-proxy's config.conf says its kubeconfig is.
	var cm corev1.ConfigMap
	b, err = os.ReadFile(filepath.Join("..", "..", "proxier", "config", "testdata", "kube-proxy-configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &cm); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(confPath, []byte(cm.Data["config.conf"]), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := &cobra.Command{Use: "run"}
	of := config.NewFlags(probe.Flags())
	if err := probe.Flags().Parse([]string{"--config", confPath, "--hostname-override", "node-1"}); err != nil {
		t.Fatal(err)
	}
	kp, _, err := of.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(kp.Kubeconfig)

	spec := ds.Spec.Template.Spec
	volume := ""
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "kube-proxy" {
			volume = v.Name
		}
	}
	if volume == "" {
		t.Fatalf("no volume of ConfigMap kube-proxy in %+v", spec.Volumes)
	}
	origSpec := orig.Spec.Template.Spec
	for _, c := range []struct {
		container, orig corev1.Container
		cmd             *cobra.Command
	}{{spec.InitContainers[0], origSpec.InitContainers[0], newPreflightCommand()}, {spec.Containers[0], origSpec.Containers[0], newRunCommand()}} {
		mounted := slices.ContainsFunc(c.container.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == volume && m.MountPath == dir && m.ReadOnly
		})
		if !mounted {
			t.Errorf("%s: ConfigMap kube-proxy not mounted read-only at %s: %+v", c.container.Name, dir, c.container.VolumeMounts)
		}
		if err := c.cmd.ParseFlags(c.container.Command[2:]); err != nil {
			t.Fatalf("%s: %q: %v", c.container.Name, c.container.Command, err)
		}
		// Only --config changed.
		want := slices.Clone(c.orig.Command)
		for i, arg := range want {
			if strings.HasPrefix(arg, "--config=") {
				want[i] = "--config=" + filepath.Join(dir, "config.conf")
			}
		}
		if !slices.Equal(c.container.Command, want) {
			t.Errorf("%s: command %q, want %q", c.container.Name, c.container.Command, want)
		}
	}
}
