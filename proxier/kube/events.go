package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// eventSink writes the recorder's Events (record.EventSink) in the
// namespace each names, as client-go's EventSinkImpl over a client of
// every namespace does: a new Event is created, a repeated one patched
// (strategic merge, its count and last time), and updated when the
// recorder asks. The recorder gives no context: each request has the
// client's own timeouts.
type eventSink struct{ rc rest.Interface }

func (s eventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return s.do(s.rc.Post().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").Body(e))
}

func (s eventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return s.do(s.rc.Put().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").Name(e.Name).Body(e))
}

func (s eventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.do(s.rc.Patch(types.StrategicMergePatchType).NamespaceIfScoped(e.Namespace, e.Namespace != "").
		Resource("events").Name(e.Name).Body(data))
}

func (s eventSink) do(req *rest.Request) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := req.Do(context.Background()).Into(out)
	return out, err
}
