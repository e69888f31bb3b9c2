//go:build tools

// Package k8sbin pins the Kubernetes commands that the e2e fixtures build:
// the control plane, kube-proxy to compare with and migrate from, and the
// kubelet of the bed's one-node cluster. It is
// a separate module so that the main module's ./... never sees it and CI
// needs no `go mod tidy`.
package k8sbin

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
