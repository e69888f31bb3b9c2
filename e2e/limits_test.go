package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// overLimits creates what a tenant would write to fill a node's ipsets
// (issue 41): a Service of 1,024 externalIPs × 1,025 ports (1M virtual
// servers), and a Service whose ten EndpointSlices hold 1,000 endpoints ×
// 100 ports each (1M endpoint ports). Each is refused whole with an Event
// (the agent's default limits), nothing of either reaches the kernel, the
// agent stays healthy (/livez and /healthz 200: no probe would restart it)
// and a Service created after them is programmed and answers. The caller's
// steady traffic shows that every other Service kept working.
func (e env) overLimits(t *testing.T, ns string, bes []backend) {
	ctx := context.Background()
	wide := e.createService(t, ns, "wide", nil, func(s *corev1.Service) {
		for i := range 1025 {
			s.Spec.Ports = append(s.Spec.Ports, tcpPort(fmt.Sprintf("p%d", i), int32(2000+i)))
		}
		for i := range 1024 {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, fmt.Sprintf("198.18.%d.%d", i/250, 1+i%250))
		}
	})
	deep := e.createService(t, ns, "deep", []corev1.ServicePort{tcpPort("p0", 80)})
	var ports []discoveryv1.EndpointPort
	for p := range 100 {
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", p)), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))})
	}
	for s := range 10 {
		var extra []string
		for i := range 1000 - len(bes) {
			extra = append(extra, fmt.Sprintf("10.%d.%d.%d", 110+s, i/250, 1+i%250))
		}
		e.createSlice(t, deep, fmt.Sprintf("deep-%d", s), discoveryv1.AddressTypeIPv4, ports, endpointsOf(bes, extra))
	}
	e.expectEvent(t, wide, "not programmed: the Service wants 1050625 virtual servers")
	e.expectEvent(t, deep, "not programmed: its EndpointSlices hold 1000000 endpoint ports")
	e.expectLog(t, "service not programmed", ns+"/deep")

	// A Service made after them is programmed and answers.
	after := e.createService(t, ns, "after-limits", []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, after, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", hostPort(after.Spec.ClusterIP, 80), names(bes))

	table := e.ipvsadm(t)
	for _, svc := range []*corev1.Service{wide, deep} {
		if strings.Contains(table, svc.Spec.ClusterIP+":") {
			t.Errorf("%s/%s is refused but has virtual servers on %s", ns, svc.Name, svc.Spec.ClusterIP)
		}
	}
	if strings.Contains(table, "198.18.") {
		t.Error("a refused Service's externalIPs have virtual servers")
	}
	for set, most := range map[string]int{"IPVSP-SERVICE": 2000, "IPVSP-HAIRPIN": 2000} {
		if n := e.setSize(t, set); n > most {
			t.Errorf("%s holds %d entries, want at most %d: a refused Service's entries are in it", set, n, most)
		}
	}
	for _, url := range []string{livezURL, healthzURL} {
		if code, body := e.httpGet(t, url); code != 200 {
			t.Errorf("%s answers %d with two Services over the limits: %s", url, code, body)
		}
	}
	if code, body := e.httpGet(t, metricsURL); code != 200 || !regexp.MustCompile(`(?m)^ipvs_proxy_services_failing [2-9]`).MatchString(body) {
		t.Errorf("/metrics (%d) does not count the two refused Services as failing", code)
	}

	for _, name := range []string{"wide", "deep", "after-limits"} {
		if err := e.Client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Minute, func() error {
		if n := e.setSize(t, "IPVSP-SERVICE"); n > 100 {
			return fmt.Errorf("IPVSP-SERVICE holds %d entries after the deletions", n)
		}
		return nil
	})
}

// setSize is the number of entries of an ipset in the VM.
func (e env) setSize(t *testing.T, name string) int {
	t.Helper()
	out := e.vmRun(t, "ipset", "list", "-t", name)
	m := regexp.MustCompile(`Number of entries: (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ipset list -t %s: no entry count in\n%s", name, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
