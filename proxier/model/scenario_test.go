package model_test

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/tools/txtar"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// The golden scenarios of Build: one txtar file a case under
// testdata/build (how to add one: proxier/README.md, "Golden cases of
// model.Build").
// The file's comment says what the case shows; its sections are
//
//	objects.yaml  Services (v1) and EndpointSlices (discovery.k8s.io/v1),
//	              YAML documents separated by "---"; each slice names its
//	              Service by the kubernetes.io/service-name label
//	node.yaml     optional: scenarioNode's fields (zero NodeInfo without)
//	config.yaml   optional: scenarioConfig's fields (zero BuildConfig without)
//	plans         the expected dump of every Service's plan (dumpPlans)
//
// Every YAML is decoded strictly: an unknown field or kind is an error.
var update = flag.Bool("update", false, "rewrite the plans sections of testdata/build/*.txtar with what Build makes")

const scenarioDir = "testdata/build"

// Section names of a scenario file.
const (
	sectionObjects = "objects.yaml"
	sectionNode    = "node.yaml"
	sectionConfig  = "config.yaml"
	sectionPlans   = "plans"
)

// scenarioNode is node.yaml: model.NodeInfo.
type scenarioNode struct {
	Name              string       `json:"name"`
	Zone              string       `json:"zone"`
	NodePortAddresses []netip.Addr `json:"nodePortAddresses"`
	Addresses         []netip.Addr `json:"addresses"`
}

// scenarioConfig is config.yaml: model.BuildConfig, with the scheduler's
// flags as --scheduler-flags spells them and the unavailable schedulers as
// a list.
type scenarioConfig struct {
	Scheduler       string         `json:"scheduler"`
	SchedulerFlags  string         `json:"schedulerFlags"`
	IPv4            bool           `json:"ipv4"`
	IPv6            bool           `json:"ipv6"`
	NodeWithoutIPv6 bool           `json:"nodeWithoutIPv6"`
	APIServer       []netip.Addr   `json:"apiServer"`
	Unavailable     []string       `json:"unavailable"`
	ServiceRanges   []netip.Prefix `json:"serviceRanges"`
	// OtherNodes maps another Node's address to its name.
	OtherNodes      map[netip.Addr]string `json:"otherNodes"`
	ExternalIPCIDRs []netip.Prefix        `json:"externalIPCIDRs"`
	Limits          scenarioLimits        `json:"limits"`
	DSR             scenarioDSR           `json:"dsr"`
}

// scenarioDSR is model.DSRConfig in a scenario's config.yaml.
type scenarioDSR struct {
	Off     string `json:"offBecause"` // not "off", a YAML 1.1 boolean
	GUEPort uint16 `json:"guePort"`
}

// scenarioLimits is model.Limits in a scenario's config.yaml.
type scenarioLimits struct {
	VirtualServers              int `json:"virtualServers"`
	RealServersPerVirtualServer int `json:"realServersPerVirtualServer"`
	RealServers                 int `json:"realServers"`
	SetEntries                  int `json:"setEntries"`
}

// scenario is one file, decoded.
type scenario struct {
	services []*corev1.Service                       // sorted by namespace/name
	slices   map[string][]*discoveryv1.EndpointSlice // by the Service's namespace/name
	node     model.NodeInfo
	cfg      model.BuildConfig
}

func TestBuildScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(scenarioDir, "*.txtar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scenario files in %s", scenarioDir)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txtar"), func(t *testing.T) {
			ar, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := parseScenario(file, ar)
			if err != nil {
				t.Fatal(err)
			}
			got := dumpPlans(sc.build())
			plans := scenarioSection(ar, sectionPlans)
			if *update {
				if plans == nil {
					ar.Files = append(ar.Files, txtar.File{Name: sectionPlans})
					plans = &ar.Files[len(ar.Files)-1]
				}
				plans.Data = []byte(got)
				if err := os.WriteFile(file, txtar.Format(ar), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if plans == nil {
				t.Fatalf("%s: no %s section (write one with -update)", file, sectionPlans)
			}
			// Lines, so that the diff shows whole lines of the dump.
			if diff := cmp.Diff(strings.Split(string(plans.Data), "\n"), strings.Split(got, "\n")); diff != "" {
				t.Errorf("%s: plans differ (-file +Build); if Build is right, go test ./proxier/model -run TestBuildScenarios -update:\n%s", file, diff)
			}
		})
	}
}

// TestScenarioConfigCoversBuild keeps config.yaml in step with Build's
// input: a field added to BuildConfig must be given a name in
// scenarioConfig and a line in toBuildConfig. (node.yaml needs no test:
// scenarioNode converts to NodeInfo, which fails to compile when their
// fields differ.)
func TestScenarioConfigCoversBuild(t *testing.T) {
	build, file := reflect.TypeFor[model.BuildConfig](), reflect.TypeFor[scenarioConfig]()
	for i := range build.NumField() {
		if _, ok := file.FieldByName(build.Field(i).Name); !ok {
			t.Errorf("BuildConfig.%s cannot be set by a scenario file: add it to scenarioConfig", build.Field(i).Name)
		}
	}
}

// scenarioSection returns the named section of ar, nil if it has none.
func scenarioSection(ar *txtar.Archive, name string) *txtar.File {
	for i := range ar.Files {
		if ar.Files[i].Name == name {
			return &ar.Files[i]
		}
	}
	return nil
}

// parseScenario checks a file's sections and decodes them.
func parseScenario(file string, ar *txtar.Archive) (*scenario, error) {
	if len(bytes.TrimSpace(ar.Comment)) == 0 {
		return nil, fmt.Errorf("%s: no description: say above the first section what the case shows", file)
	}
	seen := map[string]bool{}
	for _, f := range ar.Files {
		switch {
		case seen[f.Name]:
			return nil, fmt.Errorf("%s: section %q twice", file, f.Name)
		case f.Name != sectionObjects && f.Name != sectionNode && f.Name != sectionConfig && f.Name != sectionPlans:
			return nil, fmt.Errorf("%s: unknown section %q (want %s, %s, %s, %s)", file, f.Name,
				sectionObjects, sectionNode, sectionConfig, sectionPlans)
		}
		seen[f.Name] = true
	}
	objects := scenarioSection(ar, sectionObjects)
	if objects == nil {
		return nil, fmt.Errorf("%s: no %s section", file, sectionObjects)
	}
	sc, err := decodeObjects(file, objects.Data)
	if err != nil {
		return nil, err
	}
	var node scenarioNode
	if err := decodeStrict(file, ar, sectionNode, &node); err != nil {
		return nil, err
	}
	sc.node = model.NodeInfo(node)
	var cfg scenarioConfig
	if err := decodeStrict(file, ar, sectionConfig, &cfg); err != nil {
		return nil, err
	}
	if sc.cfg, err = cfg.toBuildConfig(); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", file, sectionConfig, err)
	}
	return sc, nil
}

// decodeStrict decodes an optional YAML section into v, refusing unknown
// and duplicate fields; without the section v is left as it is.
func decodeStrict(file string, ar *txtar.Archive, name string, v any) error {
	s := scenarioSection(ar, name)
	if s == nil {
		return nil
	}
	if err := yaml.UnmarshalStrict(s.Data, v); err != nil {
		return fmt.Errorf("%s: %s: %w", file, name, err)
	}
	return nil
}

func (c scenarioConfig) toBuildConfig() (model.BuildConfig, error) {
	out := model.BuildConfig{Scheduler: scheduler.Spec{Name: c.Scheduler}, IPv4: c.IPv4, IPv6: c.IPv6,
		ServiceRanges: c.ServiceRanges, NodeWithoutIPv6: c.NodeWithoutIPv6, APIServer: c.APIServer,
		OtherNodes: c.OtherNodes, ExternalIPCIDRs: c.ExternalIPCIDRs, Limits: model.Limits(c.Limits),
		DSR: model.DSRConfig(c.DSR)}
	if c.SchedulerFlags != "" {
		flags, err := scheduler.ParseFlags(c.Scheduler, c.SchedulerFlags)
		if err != nil {
			return out, err
		}
		out.Scheduler.Flags = flags
	}
	for _, name := range c.Unavailable {
		if out.Unavailable == nil {
			out.Unavailable = map[string]bool{}
		}
		out.Unavailable[name] = true
	}
	return out, nil
}

// decodeObjects reads objects.yaml: Services and EndpointSlices only, each
// slice labelled with a Service of the file. A missing namespace is
// "default", as kubectl makes it.
func decodeObjects(file string, data []byte) (*scenario, error) {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	sc := &scenario{slices: map[string][]*discoveryv1.EndpointSlice{}}
	services := map[string]bool{}
	var slices []*discoveryv1.EndpointSlice
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %s: document %d: %w", file, sectionObjects, n, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: document %d: %w", file, sectionObjects, n, err)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			key := o.Namespace + "/" + o.Name
			if services[key] {
				return nil, fmt.Errorf("%s: %s: Service %s twice", file, sectionObjects, key)
			}
			services[key] = true
			sc.services = append(sc.services, o)
		case *discoveryv1.EndpointSlice:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			slices = append(slices, o)
		default:
			return nil, fmt.Errorf("%s: %s: document %d: kind %s of %s is not a v1 Service or a discovery.k8s.io/v1 EndpointSlice",
				file, sectionObjects, n, gvk.Kind, gvk.GroupVersion())
		}
	}
	for _, s := range slices {
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		if !services[key] {
			return nil, fmt.Errorf("%s: %s: EndpointSlice %s/%s: label %s names no Service of the file (%s)",
				file, sectionObjects, s.Namespace, s.Name, discoveryv1.LabelServiceName, key)
		}
		sc.slices[key] = append(sc.slices[key], s)
	}
	sort.Slice(sc.services, func(i, j int) bool {
		a, b := sc.services[i], sc.services[j]
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
	})
	return sc, nil
}

// scenarioResult is one Service of a scenario with its plan.
type scenarioResult struct {
	svc  *model.Service
	plan model.ServicePlan
}

// build runs Build on each Service with its slices, as the agent's
// informers hold them (model.ServiceOf, model.SlicesOf).
func (sc *scenario) build() []scenarioResult {
	var out []scenarioResult
	for _, s := range sc.services {
		svc := model.ServiceOf(s)
		in := model.SlicesOf(sc.slices[s.Namespace+"/"+s.Name])
		out = append(out, scenarioResult{svc, model.Build(svc, in, sc.node, sc.cfg)})
	}
	return out
}

// dumpPlans writes the plans as text, one line a fact, in the order
// Build gives (virtual servers sorted by address, protocol and port; real
// servers by address and port; warnings as found), the Services in the
// order given:
//
//	service NAMESPACE/NAME
//	  created TIME                                       (when set)
//	  healthCheck nodePort=N localEndpoints=N            (when either is set)
//	  refused: TEXT                                      (over a limit)
//	  nodeEndpoints ADDR ...                             (this node's real servers)
//	  warning: TEXT                                      (each an Event)
//	  KIND ADDR:PORT/PROTO SCHED [flags=..] [persistent=Ns] port="NAME" [local]
//	      [in-cluster-only] [node-address] [routed] [sourceRanges=CIDR,...]
//	    ADDR:PORT w=WEIGHT [drain]                      (each real server)
//
// A Service with no virtual servers says so, and whether the proxy skips it
// (model.Skip: headless, ExternalName, no cluster IP).
func dumpPlans(results []scenarioResult) string {
	var b strings.Builder
	for i, r := range results {
		if i > 0 {
			b.WriteString("\n")
		}
		p := r.plan
		fmt.Fprintf(&b, "service %s\n", p.Service)
		if !p.Created.IsZero() {
			fmt.Fprintf(&b, "  created %s\n", p.Created.UTC().Format("2006-01-02T15:04:05Z"))
		}
		if p.HealthCheckNodePort != 0 || p.LocalEndpoints != 0 {
			fmt.Fprintf(&b, "  healthCheck nodePort=%d localEndpoints=%d\n", p.HealthCheckNodePort, p.LocalEndpoints)
		}
		if p.Refused != "" {
			fmt.Fprintf(&b, "  refused: %s\n", p.Refused)
		}
		if len(p.NodeEndpoints) > 0 {
			fmt.Fprintf(&b, "  nodeEndpoints %s\n", strings.Trim(fmt.Sprint(p.NodeEndpoints), "[]"))
		}
		for _, w := range p.Warnings {
			fmt.Fprintf(&b, "  warning: %s\n", w)
		}
		if len(p.VirtualServers) == 0 {
			if model.Skip(r.svc) {
				b.WriteString("  skipped: no virtual servers\n")
			} else {
				b.WriteString("  no virtual servers\n")
			}
		}
		for _, vs := range p.VirtualServers {
			dumpVirtualServer(&b, vs)
		}
	}
	return b.String()
}

func dumpVirtualServer(b *strings.Builder, vs model.VSPlan) {
	fmt.Fprintf(b, "  %s %s port=%q", vs.Kind, vs.VirtualServer, vs.PortName)
	for _, f := range []struct {
		set  bool
		name string
	}{{vs.Local, "local"}, {vs.InClusterOnly, "in-cluster-only"}, {vs.NodeAddress, "node-address"}, {vs.Routed, "routed"}} {
		if f.set {
			b.WriteString(" " + f.name)
		}
	}
	if len(vs.SourceRanges) > 0 {
		ranges := make([]string, len(vs.SourceRanges))
		for i, p := range vs.SourceRanges {
			ranges[i] = p.String()
		}
		fmt.Fprintf(b, " sourceRanges=%s", strings.Join(ranges, ","))
	}
	if vs.Forward != ktypes.ForwardNAT {
		fmt.Fprintf(b, " forward=%s", vs.Forward)
		if vs.TunPort != 0 {
			fmt.Fprintf(b, ":%d", vs.TunPort)
		}
		fmt.Fprintf(b, " inCluster->%s", vs.InClusterTo)
	}
	b.WriteString("\n")
	if len(vs.RealServers) == 0 {
		b.WriteString("    (no real servers)\n")
	}
	for _, rs := range vs.RealServers {
		fmt.Fprintf(b, "    %s\n", rs)
	}
}

// TestScenarioFileErrors: a scenario file that is not what it should be
// fails with an error naming the file and the problem, never with a plan.
func TestScenarioFileErrors(t *testing.T) {
	const svc = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web}\nspec:\n  clusterIP: 10.96.0.10\n"
	for _, tc := range []struct{ name, file, want string }{
		{"no description", "-- objects.yaml --\n" + svc, "no description"},
		{"unknown section", "x\n-- object.yaml --\n" + svc, `unknown section "object.yaml"`},
		{"no objects", "x\n-- plans --\n", "no objects.yaml section"},
		{"unregistered kind", "x\n-- objects.yaml --\napiVersion: example.com/v1\nkind: Widget\n", `document 1: no kind "Widget" is registered`},
		{"other kind", "x\n-- objects.yaml --\n" + svc + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
			"document 2: kind Pod of v1 is not a v1 Service"},
		{"unknown object field", "x\n-- objects.yaml --\n" + svc + "  externalTrafficPolice: Local\n", "externalTrafficPolice"},
		{"slice of no Service", "x\n-- objects.yaml --\n" + svc + "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n" +
			"metadata: {namespace: ns, name: s, labels: {kubernetes.io/service-name: api}}\naddressType: IPv4\n", "names no Service of the file (ns/api)"},
		{"unknown node field", "x\n-- objects.yaml --\n" + svc + "-- node.yaml --\nnodeName: a\n", `node.yaml: error unmarshaling JSON: while decoding JSON: json: unknown field "nodeName"`},
		{"bad config address", "x\n-- objects.yaml --\n" + svc + "-- config.yaml --\nexcludeCIDRs: [10.0.0.0]\n", "config.yaml"},
		{"bad scheduler flag", "x\n-- objects.yaml --\n" + svc + "-- config.yaml --\nscheduler: rr\nschedulerFlags: sh-port\n", `scheduler flag "sh-port" applies to scheduler "sh"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseScenario("case.txtar", txtar.Parse([]byte(tc.file)))
			if err == nil || !strings.HasPrefix(err.Error(), "case.txtar: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming case.txtar and saying %q", err, tc.want)
			}
		})
	}
}
