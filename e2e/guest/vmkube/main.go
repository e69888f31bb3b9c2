// Command vmkube runs inside the test VM and lists the Services of the
// host's apiserver, to prove that a process in the VM reaches it through
// the forward. Usage: vmkube KUBECONFIG
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vmkube:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: vmkube KUBECONFIG")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Args[1])
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	for _, s := range list.Items {
		fmt.Printf("%s/%s %s\n", s.Namespace, s.Name, s.Spec.ClusterIP)
	}
	return nil
}
