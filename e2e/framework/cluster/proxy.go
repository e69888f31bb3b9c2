package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/manifest"
)

// DeployIPVSProxy installs ipvs-proxy as users do: every object of
// deployDir/*.yaml (the repository's deploy/), server-side applied, with
// the apiserver's address and the cluster's pod CIDR set in its ConfigMap
// as the ConfigMap's comments ask. It returns once the DaemonSet's pod is
// ready (up to 5 minutes).
func (c *Cluster) DeployIPVSProxy(ctx context.Context, deployDir string) error {
	return c.deployIPVSProxy(ctx, deployDir, true, nil)
}

// DeployIPVSProxyLabelled is DeployIPVSProxy with podLabels added to the
// DaemonSet's pod template (its selector unchanged): for tests that find
// the node proxy's pods by kube-proxy's label, k8s-app=kube-proxy. Not
// shipped so: on a cluster that still runs kube-proxy's DaemonSet, whose
// selector is that label, the two would overlap.
func (c *Cluster) DeployIPVSProxyLabelled(ctx context.Context, deployDir string, podLabels map[string]string) error {
	return c.deployIPVSProxy(ctx, deployDir, true, podLabels)
}

// DeployIPVSProxyShipped is DeployIPVSProxy with the ConfigMap's
// clusterCIDRs left as shipped (empty): the agent knows no pod range.
func (c *Cluster) DeployIPVSProxyShipped(ctx context.Context, deployDir string) error {
	return c.deployIPVSProxy(ctx, deployDir, false, nil)
}

// DeployIPVSProxyEdited is DeployIPVSProxy with the ConfigMap's
// config.yaml edited: each pair of edits replaces its first string, which
// must be there, by its second (e.g. to turn an option on as users would).
func (c *Cluster) DeployIPVSProxyEdited(ctx context.Context, deployDir string, edits ...string) error {
	if len(edits)%2 != 0 {
		return fmt.Errorf("cluster: DeployIPVSProxyEdited: %d edits, want pairs", len(edits))
	}
	return c.deployIPVSProxy(ctx, deployDir, true, nil, edits...)
}

func (c *Cluster) deployIPVSProxy(ctx context.Context, deployDir string, setClusterCIDR bool, podLabels map[string]string, edits ...string) error {
	objs, err := manifest.ReadDir(deployDir)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	for _, obj := range objs {
		if obj.GetKind() == "DaemonSet" && obj.GetName() == "ipvs-proxy" {
			if err := addPodLabels(obj, podLabels); err != nil {
				return fmt.Errorf("cluster: DaemonSet ipvs-proxy in %s: %w", deployDir, err)
			}
		}
		if obj.GetKind() != "ConfigMap" || obj.GetName() != "ipvs-proxy" {
			continue
		}
		data, ok := obj.Object["data"].(map[string]any)
		if !ok {
			return fmt.Errorf("cluster: ConfigMap ipvs-proxy in %s has no data", deployDir)
		}
		kc, _ := data["kubeconfig.conf"].(string)
		cfg, _ := data["config.yaml"].(string)
		if !strings.Contains(kc, "APISERVER-HOST:6443") || !strings.Contains(cfg, "clusterCIDRs: []") {
			return fmt.Errorf("cluster: ConfigMap ipvs-proxy in %s: no APISERVER-HOST:6443 or clusterCIDRs: [] to fill in", deployDir)
		}
		data["kubeconfig.conf"] = strings.Replace(kc, "APISERVER-HOST:6443", c.APIServerAddr(), 1)
		if setClusterCIDR {
			cfg = strings.Replace(cfg, "clusterCIDRs: []", "clusterCIDRs: ["+ClusterCIDR+"]", 1)
		}
		for i := 0; i+1 < len(edits); i += 2 {
			if !strings.Contains(cfg, edits[i]) {
				return fmt.Errorf("cluster: ConfigMap ipvs-proxy in %s: no %q to edit", deployDir, edits[i])
			}
			cfg = strings.Replace(cfg, edits[i], edits[i+1], 1)
		}
		data["config.yaml"] = cfg
	}
	return c.applyIPVSProxy(ctx, objs)
}

// IPVSProxyPods selects ipvs-proxy's DaemonSet's pods.
const IPVSProxyPods = "app.kubernetes.io/name=ipvs-proxy"

// addPodLabels adds labels to a workload's pod template.
func addPodLabels(obj *unstructured.Unstructured, labels map[string]string) error {
	if len(labels) == 0 {
		return nil
	}
	path := []string{"spec", "template", "metadata", "labels"}
	have, _, err := unstructured.NestedStringMap(obj.Object, path...)
	if err != nil {
		return err
	}
	if have == nil {
		have = map[string]string{}
	}
	maps.Copy(have, labels)
	return unstructured.SetNestedStringMap(obj.Object, have, path...)
}

// DeployIPVSProxyChart installs ipvs-proxy as Helm users do: the chart in
// chartDir (the repository's deploy/helm/ipvs-proxy) rendered for a
// release in kube-system by Helm's Go SDK (the render tool of the module
// deploy/helm, with `go run`), over values (the apiserver's address and
// the cluster's pod CIDR are set here, as the chart asks, unless values'
// config sets clusterCIDRs; values may add more), then server-side
// applied as DeployIPVSProxy does, but for the Prometheus Operator's
// objects, kept in c.ChartMonitoring.
func (c *Cluster) DeployIPVSProxyChart(ctx context.Context, chartDir string, values map[string]any) error {
	vals := map[string]any{"apiServer": "https://" + c.APIServerAddr()}
	maps.Copy(vals, values)
	config, _ := vals["config"].(map[string]any)
	config = maps.Clone(config)
	if config == nil {
		config = map[string]any{}
	}
	if _, set := config["clusterCIDRs"]; !set {
		config["clusterCIDRs"] = []string{ClusterCIDR}
	}
	vals["config"] = config
	chart, err := filepath.Abs(chartDir)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	tmp, err := os.MkdirTemp("", "ipvs-proxy-chart-")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer os.RemoveAll(tmp)
	b, err := json.Marshal(vals)
	if err != nil {
		return fmt.Errorf("cluster: chart values: %w", err)
	}
	valuesFile := filepath.Join(tmp, "values.json")
	if err := os.WriteFile(valuesFile, b, 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "./render", "-chart", chart, "-namespace", metav1.NamespaceSystem, "-f", valuesFile)
	cmd.Dir = filepath.Dir(chart)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("cluster: render chart %s: %w\n%s", chart, err, stderr.Bytes())
	}
	objs, err := manifest.Decode(out)
	if err != nil {
		return fmt.Errorf("cluster: chart %s: %w", chart, err)
	}
	c.logf("cluster: chart %s rendered %d objects in %s (go run, Helm's SDK) with values %s", chartDir, len(objs), time.Since(start).Round(time.Millisecond), b)
	var apply []*unstructured.Unstructured
	c.ChartMonitoring = nil
	for _, obj := range objs {
		if obj.GroupVersionKind().Group == monitoringGroup {
			c.ChartMonitoring = append(c.ChartMonitoring, obj)
			continue
		}
		apply = append(apply, obj)
	}
	return c.applyIPVSProxy(ctx, apply)
}

// monitoringGroup is the Prometheus Operator's API group: the bed has no
// Operator, so none of its kinds.
const monitoringGroup = "monitoring.coreos.com"

// applyIPVSProxy server-side applies ipvs-proxy's objects and waits for
// its DaemonSet's pod to be ready.
func (c *Cluster) applyIPVSProxy(ctx context.Context, objs []*unstructured.Unstructured) error {
	a, err := manifest.NewApplier(c.CP.RESTConfig)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := a.ApplyAll(ctx, objs); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return c.WaitDaemonSet(ctx, metav1.NamespaceSystem, "ipvs-proxy", IPVSProxyPods)
}

// WaitDaemonSet waits (up to 5 minutes) until the DaemonSet ns/name has
// a ready pod on every node; selector selects its pods (for the error
// message).
func (c *Cluster) WaitDaemonSet(ctx context.Context, ns, name, selector string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	last := ""
	for {
		ds, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && ds.Status.NumberReady >= int32(len(c.Nodes)) {
			c.logStartups(ctx, ns, selector)
			return nil
		}
		last = fmt.Sprint(err)
		if err == nil {
			last = fmt.Sprintf("ready %d/%d", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		}
		if pl, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector}); err == nil {
			for i := range pl.Items {
				last += "; " + PodSummary(&pl.Items[i])
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: DaemonSet %s/%s not ready: %w: %s\nkubelet:\n%s", ns, name, ctx.Err(), last, tailString(c.KubeletLog(), 3000))
		case <-time.After(time.Second):
		}
	}
}

// logStartups logs when each selected pod got to each step of its start
// (scheduled, init containers run, containers started, ready), as
// seconds after the pod's creation: where a DaemonSet's start goes.
func (c *Cluster) logStartups(ctx context.Context, ns, selector string) {
	pl, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		c.logf("cluster: pods %s in %s: %v", selector, ns, err)
		return
	}
	for i := range pl.Items {
		c.logf("cluster: %s started: %s", pl.Items[i].Name, PodStartup(&pl.Items[i]))
	}
}

// PodStartup is a one-line account of a pod's start: each step's time
// in seconds after the pod was created (the apiserver's and the node's
// clocks, whole seconds).
func PodStartup(p *corev1.Pod) string {
	created := p.CreationTimestamp.Time
	at := func(t metav1.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.0fs", t.Sub(created).Seconds())
	}
	var steps []string
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionTrue {
			steps = append(steps, "scheduled "+at(cond.LastTransitionTime))
		}
	}
	for _, st := range p.Status.InitContainerStatuses {
		if term := st.State.Terminated; term != nil {
			steps = append(steps, fmt.Sprintf("init %s %s..%s", st.Name, at(term.StartedAt), at(term.FinishedAt)))
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		if run := st.State.Running; run != nil {
			steps = append(steps, fmt.Sprintf("%s started %s", st.Name, at(run.StartedAt)))
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			steps = append(steps, "ready "+at(cond.LastTransitionTime))
		}
	}
	return strings.Join(steps, ", ")
}

// PodSummary is a one-line account of a pod's phase, its containers'
// states and its conditions that do not hold.
func PodSummary(p *corev1.Pod) string {
	s := p.Name + " " + string(p.Status.Phase)
	for _, st := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		switch {
		case st.State.Waiting != nil:
			s += fmt.Sprintf(" %s:waiting(%s %s)", st.Name, st.State.Waiting.Reason, st.State.Waiting.Message)
		case st.State.Terminated != nil:
			s += fmt.Sprintf(" %s:terminated(%s %d)", st.Name, st.State.Terminated.Reason, st.State.Terminated.ExitCode)
		case st.State.Running != nil:
			s += fmt.Sprintf(" %s:running(ready=%v restarts=%d)", st.Name, st.Ready, st.RestartCount)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			s += fmt.Sprintf(" [%s: %s]", cond.Type, cond.Message)
		}
	}
	return s
}

// StartKubeProxy runs upstream kube-proxy v1.36.3 in IPVS mode on every
// node in place of ipvs-proxy's DaemonSet (the comparison row of the e2e
// suite): as a process in each VM (e2e/framework/kubeproxy), with the
// node's name, the kubelet's kubeconfig, the cluster's pod CIDR and node
// ports on every local address (as deploy/'s nodePortAddresses: []), and
// its own conntrack defaults (ipvs-proxy's DaemonSet sets the same; the
// cluster's VMs are its own). It returns after every kube-proxy's first
// sync. Deploy one proxy only.
func (c *Cluster) StartKubeProxy(ctx context.Context) ([]*kubeproxy.KubeProxy, error) {
	var kps []*kubeproxy.KubeProxy
	for _, n := range c.Nodes {
		kp, err := kubeproxy.StartIn(ctx, n.VM, kubeproxy.Options{
			Log: c.logf, Kubeconfig: guestKubeconfig, NodeName: n.Name,
			ClusterCIDR: ClusterCIDR, NodePortAddresses: []string{}, ConntrackDefaults: true,
		})
		if err != nil {
			return nil, fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		kps = append(kps, kp)
	}
	return kps, nil
}
