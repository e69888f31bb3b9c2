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

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
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

	// Every option is spelled out, under its json name.
	var keys map[string]any
	if err := yaml.Unmarshal([]byte(cfgYAML), &keys); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(options{})
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if _, ok := keys[name]; !ok && name != "hostnameOverride" {
			t.Errorf("config.yaml does not list option %q", name)
		}
	}

	// It loads with `run --config` and differs from the defaults only in
	// the kubeconfig.
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfgYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := &cobra.Command{Use: "run"}
	of := newOptionFlags(cmd.Flags())
	if err := cmd.Flags().Parse([]string{"--config", path, "--hostname-override", "node-1"}); err != nil {
		t.Fatal(err)
	}
	o, _, err := of.resolve()
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml: %v", err)
	}
	want := defaultOptions()
	want.Kubeconfig = "/etc/ipvs-proxy/kubeconfig.conf"
	want.HostnameOverride = "node-1"
	got := *o
	for _, s := range []*[]string{&got.NodePortAddresses, &got.ExcludeCIDRs, &got.ClusterCIDRs} {
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
		if _, ok := mounts(c)[hostProcSys+"/net"]; !ok {
			t.Errorf("%s: the node's /proc/sys/net is not at %s/net", c.Name, hostProcSys)
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
		probes = append(probes, p.HTTPGet.Path+":"+p.HTTPGet.Port.String())
	}
	if want := []string{"/livez:10256", "/livez:10256", "/healthz:10256"}; !slices.Equal(probes, want) {
		t.Errorf("probes %v, want %v", probes, want)
	}
}
