package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node lost and booted again, as a power cut and the reboot after it:
// LoseNode, then RebootNode. Between them the node is gone as the rest of
// the cluster sees it: its address answers nothing on the segment, its
// kubelet posts nothing, the apiserver cannot reach it. Its Node object and
// its pods stay in the apiserver; the control plane notices the loss on
// its own (kube-controller-manager's node monitor grace period, 50 s by
// default: the Node's Ready turns Unknown, its pods' Ready False, their
// endpoints not ready), as it would in a real cluster.

// LoseNode ends n's VM at once (vm.VM.PowerLoss): no clean shutdown, its
// kernel's state (IPVS, conntrack, routes, containers) gone with it. n.VM
// stays the dead VM (its console readable) until RebootNode; anything run
// on it fails.
func (c *Cluster) LoseNode(n *Node) error {
	if n.VM == nil {
		return fmt.Errorf("cluster: lose %s: it has no VM", n.Name)
	}
	if err := n.VM.PowerLoss(); err != nil {
		return fmt.Errorf("cluster: lose %s: %w", n.Name, err)
	}
	c.mu.Lock()
	n.containerd, n.kubelet = nil, nil
	c.mu.Unlock()
	c.logf("cluster: %s: VM killed (power loss)", n.Name)
	return nil
}

// staleReadyWait bounds RebootNode's wait for the control plane to see
// the loss: the node monitor's grace period (50 s) and its 5 s period,
// with room for a busy machine.
const staleReadyWait = 3 * time.Minute

// RebootNode boots a node that LoseNode took down again as the same node:
// the same name, segment MAC and address, and its Node object kept (node
// IPAM's pod CIDR with it); containerd, the images and the kubelet as at
// Start, the CNI configuration written for the Node's pod CIDR, and the
// routes between the nodes' pods made again (routePodCIDRs). The kubelet
// then starts the pods bound to the node again (its DaemonSets' among
// them). It first waits until the Node's Ready condition is no longer True
// (the control plane has seen the loss), so that the Ready it then waits
// for is the new kubelet's; it returns once the Node is Ready.
func (c *Cluster) RebootNode(ctx context.Context, n *Node) error {
	if n.VM == nil {
		return fmt.Errorf("cluster: reboot %s: it has no VM", n.Name)
	}
	if dead, _ := n.VM.Exited(); !dead {
		return fmt.Errorf("cluster: reboot %s: its VM runs (LoseNode first)", n.Name)
	}
	if err := c.waitNotReady(ctx, n); err != nil {
		return err
	}
	began := time.Now()
	if err := c.startNodeRetrying(ctx, n, c.vmOpts, true); err != nil {
		return fmt.Errorf("cluster: reboot %s: %w", n.Name, err)
	}
	if err := c.routePodCIDRs(ctx); err != nil {
		return fmt.Errorf("cluster: reboot %s: %w", n.Name, err)
	}
	c.logf("cluster: %s: rebooted, Ready after %s", n.Name, time.Since(began).Round(time.Millisecond))
	return nil
}

// waitNotReady waits, up to staleReadyWait, until n's Node has a Ready
// condition that is not True.
func (c *Cluster) waitNotReady(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, staleReadyWait)
	defer cancel()
	for {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil && !nodeReady(node) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("its Node is still Ready")
			}
			return fmt.Errorf("cluster: reboot %s: the control plane has not seen the loss after %s: %w", n.Name, staleReadyWait, err)
		case <-time.After(time.Second):
		}
	}
}

// nodeReady reports whether node's Ready condition is True.
func nodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
