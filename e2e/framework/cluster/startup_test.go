package cluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodStartup(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	after := func(s int) metav1.Time { return metav1.NewTime(t0.Add(time.Duration(s) * time.Second)) }
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)},
		Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: after(1)},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: after(48)},
			},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "preflight",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: after(3), FinishedAt: after(20)}}}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "ipvs-proxy",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: after(22)}}}},
		},
	}
	want := "scheduled 1s, init preflight 3s..20s, ipvs-proxy started 22s, ready 48s"
	if got := PodStartup(p); got != want {
		t.Errorf("PodStartup:\n got %q\nwant %q", got, want)
	}
	p.Status = corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{Name: "preflight",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: after(3)}}}}}
	if got, want := PodStartup(p), "init preflight 3s..-"; got != want {
		t.Errorf("PodStartup, unfinished:\n got %q\nwant %q", got, want)
	}
}
