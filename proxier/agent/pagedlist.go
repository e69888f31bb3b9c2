package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// listPage is how many objects a page of a list holds (the informers'
// initial lists, ListServices, ListEndpointSlices), as client-go's pager
// asks.
const listPage = 500

// pagedListWatch lists and watches one kind of object for an informer. It
// lists in pages and keeps of each page only the compact objects that the
// informer's transform makes (model.Compact), so that the initial list is
// never decoded whole: client-go's own paths either stream the list as
// watch events (WatchListClient), which in the bed's emulated VM took 1.7
// to 2 times as long as these pages, with more CPU (e2e/README.md, "Paged
// initial lists"), or ask for it in one response, decoded whole before
// any transform. A list error is returned as the apiserver's, unwrapped:
// the reflector tells an expired list by it. An apiserver that cannot be
// reached is waited for here, not by the reflector (untilReachable).
type pagedListWatch struct {
	list      func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch     func(context.Context, metav1.ListOptions) (watch.Interface, error)
	transform cache.TransformFunc
	page      int64
	reach     reacher
}

var _ cache.ListerWatcherWithContext = (*pagedListWatch)(nil)

// IsWatchListSemanticsUnSupported tells client-go's reflector to list
// (ListWithContext) rather than stream the initial list.
func (l *pagedListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// ListWithContext lists every object, page after page, from the most
// recent state (resourceVersion ""), whatever version the reflector asks
// at least: a consistent snapshot that is never older than what it asked,
// and the only one that every apiserver pages. The reflector's limit is
// not used. A continuation that has expired fails the list with the
// apiserver's error, and the reflector lists again.
func (l *pagedListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	opts.ResourceVersion, opts.ResourceVersionMatch, opts.Continue = "", "", ""
	opts.Limit = l.page
	out := &compactList{}
	for {
		page, err := untilReachable(ctx, l.reach, func() (runtime.Object, error) { return l.list(ctx, opts) })
		if err != nil {
			return nil, err
		}
		lm, err := meta.ListAccessor(page)
		if err != nil {
			return nil, fmt.Errorf("paged list: %w", err)
		}
		items, err := meta.ExtractList(page)
		if err != nil {
			return nil, fmt.Errorf("paged list: %w", err)
		}
		out.Items = slices.Grow(out.Items, len(items)+int(ptr.Deref(lm.GetRemainingItemCount(), 0)))
		for _, it := range items {
			c, err := l.transform(it)
			if err != nil {
				return nil, fmt.Errorf("paged list: %w", err)
			}
			obj, ok := c.(runtime.Object)
			if !ok {
				return nil, fmt.Errorf("paged list: the transform made a %T, not a runtime.Object", c)
			}
			out.Items = append(out.Items, obj)
		}
		out.ResourceVersion = lm.GetResourceVersion()
		if opts.Continue = lm.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}

// List is ListWithContext without a context of its own.
func (l *pagedListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

// WatchWithContext watches from the version the reflector asks.
func (l *pagedListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return untilReachable(ctx, l.reach, func() (watch.Interface, error) { return l.watch(ctx, opts) })
}

// Watch is WatchWithContext without a context of its own.
func (l *pagedListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// reacher waits for an apiserver that cannot be reached, on its clock (a
// test's fake one drives an outage of minutes in milliseconds).
type reacher struct {
	clock   clock.Clock
	backoff wait.Backoff
	log     *zap.Logger
}

// newReacher tries a list or watch again while the apiserver cannot be
// reached: after 0.8 s, doubling, each wait drawn between once and twice
// its step, the step capped at 5 s, so that once the apiserver is back its
// changes reach the agent within 10 s (about 4 s on average after a long
// outage). client-go's reflector, left to it, grows its wait the same way
// to a cap of 30 s, waits of 30 to 60 s: after an outage of a minute or
// more the agent went on serving the old state for up to a minute
// (TestReflectorBackoffAfterOutage). client-go v0.36 has a
// ReflectorOptions.Backoff, but no informer passes one to its reflector
// (kubernetes issue 136943). The cap keeps jitter and growth: at 5,000
// nodes and four informers each, about 2,700 connection attempts a second
// against an apiserver that is gone (client-go's: about 440); an apiserver
// that answers and sheds load (429) is left to the reflector's own
// backoff, and the client honours its Retry-After.
func newReacher(clk clock.Clock, log *zap.Logger) reacher {
	return reacher{clock: clk, log: log,
		backoff: wait.Backoff{Duration: 800 * time.Millisecond, Factor: 2, Jitter: 1, Cap: 5 * time.Second, Steps: math.MaxInt32}}
}

// untilReachable calls do until the apiserver can be reached (unreachable),
// waiting r's backoff between calls, or the context ends; any other
// outcome is do's. The first failure and the return are logged: the
// reflector, which logs each failure it sees, sees none of these.
func untilReachable[T any](ctx context.Context, r reacher, do func() (T, error)) (T, error) {
	b := r.backoff
	var since time.Time
	var tries int
	for {
		v, err := do()
		if !unreachable(ctx, err) {
			if tries > 0 && err == nil {
				r.log.Info("apiserver reachable again", zap.Duration("after", r.clock.Since(since).Round(time.Millisecond)),
					zap.Int("tries", tries+1))
			}
			return v, err
		}
		if tries == 0 {
			since = r.clock.Now()
			r.log.Info("apiserver unreachable; trying again every 5 to 10 s at most", zap.Error(err))
		}
		tries++
		if !sleep(ctx, r.clock, b.Step()) {
			return v, err
		}
	}
}

// unreachable tells an apiserver that is not there (the connection refused,
// reset or cut, a timeout, a name that does not resolve) or that says it is
// unavailable (503) from one that answers, while the context lasts.
func unreachable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if apierrors.IsServiceUnavailable(err) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// compactList is a list of compact objects, as the reflector takes lists
// (meta.ListAccessor, meta.ExtractList).
type compactList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

// DeepCopyObject implements runtime.Object.
func (l *compactList) DeepCopyObject() runtime.Object {
	c := *l
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	c.Items = make([]runtime.Object, len(l.Items))
	for i, it := range l.Items {
		c.Items[i] = it.DeepCopyObject()
	}
	return &c
}

// ourSelector narrows a list or watch to the Services (and their slices)
// that the proxier serves.
func ourSelector(o metav1.ListOptions) metav1.ListOptions {
	o.LabelSelector = ServiceSelector
	return o
}

// serviceInformer watches the Services the proxier serves, listed in
// pages, kept compact (model.Compact).
func serviceInformer(client kube.Client, r reacher) cache.SharedIndexInformer {
	svcs := client.Services()
	return ourInformer(svcs.List, svcs.Watch, &corev1.Service{}, r)
}

// sliceInformer watches the EndpointSlices of the Services the proxier
// serves, listed in pages, kept compact (model.Compact).
func sliceInformer(client kube.Client, r reacher) cache.SharedIndexInformer {
	eps := client.EndpointSlices()
	return ourInformer(eps.List, eps.Watch, &discoveryv1.EndpointSlice{}, r)
}

// nodeInformer watches every Node, listed in pages, kept compact
// (model.Node: the addresses of all, the zone and podCIDRs of this one).
func nodeInformer(client kube.Client, r reacher) cache.SharedIndexInformer {
	nodes := client.Nodes()
	return pagedInformer(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return nodes.List(ctx, o)
	}, nodes.Watch, &corev1.Node{}, r)
}

// serviceCIDRInformer watches every ServiceCIDR, listed in pages, kept
// whole (model.Compact leaves them).
func serviceCIDRInformer(client kube.Client, r reacher) cache.SharedIndexInformer {
	scs := client.ServiceCIDRs()
	return pagedInformer(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return scs.List(ctx, o)
	}, scs.Watch, &networkingv1.ServiceCIDR{}, r)
}

// ourInformer is an informer of a typed client's objects that the
// proxier serves (ServiceSelector), listed in pages.
func ourInformer[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), example runtime.Object, r reacher) cache.SharedIndexInformer {
	return pagedInformer(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return list(ctx, ourSelector(o))
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return watchFn(ctx, ourSelector(o))
	}, example, r)
}

// pagedInformer is an informer without index whose lists and watches go
// through pagedListWatch: in pages, compact, an unreachable apiserver
// waited for with r.
func pagedInformer(list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), example runtime.Object, r reacher) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&pagedListWatch{list: list, watch: watchFn, transform: model.Compact, page: listPage, reach: r},
		example, 0, cache.Indexers{})
}
