package agent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
)

// TestListServices: the Services of other proxies and headless ones are
// not read, as in the proxier.
func TestListServices(t *testing.T) {
	svc := func(name string, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	}
	client := fake.NewClientset(svc("mine", nil), svc("theirs", map[string]string{"service.kubernetes.io/service-proxy-name": "other"}),
		svc("headless", map[string]string{"service.kubernetes.io/headless": ""}))
	got, err := ListServices(context.Background(), kubetest.New(client))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "mine" {
		t.Errorf("listed %v, want only ns/mine", got)
	}
}

// TestNodePodCIDRs: --detect-local-mode NodeCIDR reads the Node's
// podCIDRs (both families) with the shipped ClusterRole, which allows list
// and watch on nodes but not get (before, it got the Node and waited
// forever on Forbidden); a Node without them is waited for, and the
// wait's end is an error naming the mode and the Node; a list refused is
// an error at once.
func TestNodePodCIDRs(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}})
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "node-1", errors.New("the ClusterRole grants no get"))
	})
	got, err := NodePodCIDRs(context.Background(), kubetest.New(client), "node-1", zap.NewNop())
	want := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("node-1: %v, %v; want %v", got, err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := NodePodCIDRs(ctx, kubetest.New(client), "node-2", zap.NewNop()); err == nil || !strings.Contains(err.Error(), "NodeCIDR") || !strings.Contains(err.Error(), "node-2") {
		t.Errorf("node-2 without podCIDRs: %v; want an error naming the mode and the Node", err)
	}
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "", errors.New("no list either"))
	})
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := NodePodCIDRs(ctx, kubetest.New(client), "node-1", zap.NewNop()); !apierrors.IsForbidden(err) || ctx.Err() != nil {
		t.Errorf("list forbidden: %v; want the Forbidden error at once", err)
	}
}

// TestHostAddresses: the apiserver's address from its URL: an IP as it is
// (IPv6 in brackets, IPv4-mapped unmapped), a name resolved, a name that
// does not resolve nothing. The resolver reads /etc/hosts and sends no
// query (no packet leaves the machine in tests).
func TestHostAddresses(t *testing.T) {
	offline := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no DNS in tests")
	}}
	for _, tc := range []struct {
		server string
		want   []netip.Addr
	}{
		{"https://192.0.2.10:6443", []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		{"https://[2001:db8::1]:6443", []netip.Addr{netip.MustParseAddr("2001:db8::1")}},
		{"https://[::ffff:192.0.2.11]", []netip.Addr{netip.MustParseAddr("192.0.2.11")}},
		{"192.0.2.12:6443", []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
		{"https://localhost:6443", nil}, // resolved: checked below
		{"https://no-such-host.invalid:6443", nil},
	} {
		got := hostAddresses(context.Background(), tc.server, offline, zap.NewNop())
		if tc.server == "https://localhost:6443" {
			if !slices.ContainsFunc(got, netip.Addr.IsLoopback) {
				t.Errorf("hostAddresses(%q) = %v, want localhost resolved", tc.server, got)
			}
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("hostAddresses(%q) = %v, want %v", tc.server, got, tc.want)
		}
	}
}
