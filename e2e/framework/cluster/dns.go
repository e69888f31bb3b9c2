package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
)

// The cluster's DNS: CoreDNS built here (the wrapper module e2e/tools/coredns)
// behind the kube-dns Service, the address kubelet gives pods as their
// nameserver.
const (
	ClusterDomain = "cluster.local"
	DNSServiceIP  = "10.96.0.10"
	// DNSImage holds the CoreDNS binary as /coredns.
	DNSImage = "ipvs-proxy.test/coredns:e2e"
	dnsName  = "coredns"
)

// corefile serves the cluster's zones from the apiserver and nothing else:
// there is no forward plugin, so a name outside them gets REFUSED (no
// server block matches) and no query leaves the machine. health and ready
// serve the Deployment's probes.
const corefile = `cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        ttl 30
    }
    cache 30
}
`

// dnsImage builds CoreDNS from e2e/tools/coredns (cached like the Kubernetes
// binaries) and returns its image archive (cached by the binary's digest).
func dnsImage(ctx context.Context, cacheDir string) (string, error) {
	dir, err := controlplane.EnsureModuleBinaries(ctx, cacheDir, "e2e/tools/coredns", "coredns",
		[]controlplane.WrapperPackage{{Path: "github.com/ipvs-proxy/ipvs-proxy/e2e/tools/coredns", Binary: dnsName}})
	if err != nil {
		return "", fmt.Errorf("cluster: build CoreDNS: %w", err)
	}
	return binaryImage(cacheDir, filepath.Join(dir, dnsName), dnsName, DNSImage)
}

// deployDNS creates CoreDNS's ServiceAccount, its ClusterRole (what the
// kubernetes plugin watches) and binding, the Corefile, a Deployment of
// one replica and the kube-dns Service at DNSServiceIP, UDP and TCP 53.
// The pod reaches the apiserver through the `kubernetes` Service, so it
// gets ready once the cluster's proxy runs.
func deployDNS(ctx context.Context, cs kubernetes.Interface) error {
	const ns = metav1.NamespaceSystem
	labels := map[string]string{"k8s-app": "kube-dns"}
	meta := metav1.ObjectMeta{Name: dnsName, Namespace: ns, Labels: labels}
	create := func(what string, err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("cluster: DNS: create %s: %w", what, err)
		}
		return nil
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta}, metav1.CreateOptions{}); create("ServiceAccount", err) != nil {
		return create("ServiceAccount", err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:" + dnsName},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); create("ClusterRole", err) != nil {
		return create("ClusterRole", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:" + dnsName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: dnsName, Namespace: ns}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); create("ClusterRoleBinding", err) != nil {
		return create("ClusterRoleBinding", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"Corefile": corefile}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); create("ConfigMap", err) != nil {
		return create("ConfigMap", err)
	}
	probe := func(path string, port int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}},
			PeriodSeconds: 5, TimeoutSeconds: 5, FailureThreshold: 10,
		}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: dnsName,
					PriorityClassName:  "system-cluster-critical",
					// Its own resolver is not itself.
					DNSPolicy:                     corev1.DNSDefault,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: dnsName, Image: DNSImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Command: []string{"/" + dnsName, "-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						ReadinessProbe: probe("/ready", 8181),
						LivenessProbe:  probe("/health", 8080),
						// Upstream's manifest's requests: Burstable, as in a
						// real cluster. Without them CoreDNS was BestEffort,
						// the pod a loaded node starves first (make
						// chaos-nodes, nodes-udp-load: its probes timed out,
						// kubelet restarted it, and the cluster's UDP DNS
						// timed out, then was refused, for minutes). No
						// memory limit (upstream's is 170Mi): the bed's
						// runs go to 10,000 Services.
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: dnsName}}}}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); create("Deployment", err) != nil {
		return create("Deployment", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP: DNSServiceIP,
			Selector:  labels,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	_, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	return create("Service kube-dns", err)
}

// WaitDNS waits (up to 5 minutes) until CoreDNS's pod is ready: it has
// listed the cluster's Services through the `kubernetes` Service, so the
// cluster's proxy must run.
func (c *Cluster) WaitDNS(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	last := ""
	for {
		d, err := c.Client.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, dnsName, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas >= 1 {
			return nil
		}
		last = fmt.Sprint(err)
		if pl, err := c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"}); err == nil {
			var states []string
			for i := range pl.Items {
				states = append(states, PodSummary(&pl.Items[i]))
			}
			last = strings.Join(states, "; ")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: CoreDNS not ready: %w: %s", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}
