package main

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/workload"
)

const (
	namespace = workload.Namespace
	// Endpoints live in 10.176.0.0/12 (workload.EndpointAddr), routed in
	// the VM by a dummy interface: IPVS refuses a NAT real server it has
	// no route to.
	endpointNet = "10.176.0.1/12"
)

// service is a bench Service as the kernel should show it: one virtual
// server and its real servers (ipvsbench's input).
type service struct {
	VIP  string   `json:"vip"`
	Port uint16   `json:"port"`
	RS   []string `json:"rs"`
}

var (
	syncLine  = regexp.MustCompile(`"msg":"synced".*"kind":"(full|partial)".*"writes":(\d+).*"ipvs":([0-9.e-]+).*"took":([0-9.e-]+)`)
	vmHWMLine = regexp.MustCompile(`VmHWM:\s+(\d+) kB`)
)

type syncRecord struct {
	full   bool
	writes int
	ipvs   time.Duration // the IPVS reconciler's part
	took   time.Duration // the whole sync: plans, IPVS, iptables glue
}

func syncs(log string) []syncRecord {
	var out []syncRecord
	for _, m := range syncLine.FindAllStringSubmatch(log, -1) {
		w, _ := strconv.Atoi(m[2])
		ipvs, _ := strconv.ParseFloat(m[3], 64)
		took, _ := strconv.ParseFloat(m[4], 64)
		out = append(out, syncRecord{full: m[1] == "full", writes: w,
			ipvs: time.Duration(ipvs * float64(time.Second)), took: time.Duration(took * float64(time.Second))})
	}
	return out
}

// expected lists the bench Services as they are now: clusterIP:80 with the
// addresses of their EndpointSlice, sorted by clusterIP, and the name of
// each.
func expected(ctx context.Context, c kubernetes.Interface) ([]service, []string, error) {
	svcs, err := c.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list services: %w", err)
	}
	slicesList, err := c.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list endpointslices: %w", err)
	}
	rs := map[string][]string{}
	for _, eps := range slicesList.Items {
		for _, e := range eps.Endpoints {
			for _, a := range e.Addresses {
				rs[eps.Name] = append(rs[eps.Name], fmt.Sprintf("%s:%d", a, bed.BackendPort))
			}
		}
	}
	type named struct {
		s    service
		name string
	}
	var all []named
	for _, s := range svcs.Items {
		if len(rs[s.Name]) == 0 {
			return nil, nil, fmt.Errorf("service %s has no endpoints", s.Name)
		}
		all = append(all, named{service{VIP: s.Spec.ClusterIP, Port: 80, RS: rs[s.Name]}, s.Name})
	}
	slices.SortFunc(all, func(a, b named) int {
		return netip.MustParseAddr(a.s.VIP).Compare(netip.MustParseAddr(b.s.VIP))
	})
	out, names := make([]service, len(all)), make([]string, len(all))
	for i, n := range all {
		out[i], names[i] = n.s, n.name
	}
	return out, names, nil
}
