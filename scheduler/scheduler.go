// Package scheduler knows the IPVS schedulers and their flags, and turns a
// Service's scheduler annotations into what the kernel is asked for.
package scheduler

import (
	"fmt"
	"sort"
	"strings"
)

// Annotations on a Service that choose its scheduler.
const (
	AnnotationScheduler = "ipvs-proxy.io/scheduler"
	AnnotationFlags     = "ipvs-proxy.io/scheduler-flags"
)

// The kernel's scheduler flags (IP_VS_SVC_F_SCHED1..3); what each means
// depends on the scheduler (for sh and mh: fallback, port).
const (
	FlagSched1 uint32 = 0x0008
	FlagSched2 uint32 = 0x0010
	FlagSched3 uint32 = 0x0020
)

// Default is the scheduler used when nothing else is configured.
const Default = "rr"

// known maps every scheduler name the kernel may offer to its module.
var known = map[string]string{
	"rr": "ip_vs_rr", "wrr": "ip_vs_wrr", "lc": "ip_vs_lc", "wlc": "ip_vs_wlc",
	"lblc": "ip_vs_lblc", "lblcr": "ip_vs_lblcr", "dh": "ip_vs_dh", "sh": "ip_vs_sh",
	"sed": "ip_vs_sed", "nq": "ip_vs_nq", "mh": "ip_vs_mh", "fo": "ip_vs_fo", "ovf": "ip_vs_ovf",
}

// flags maps each scheduler flag to the scheduler it belongs to and its bit.
var flags = map[string]struct {
	scheduler string
	bit       uint32
}{
	"sh-fallback": {"sh", FlagSched1},
	"sh-port":     {"sh", FlagSched2},
	"mh-fallback": {"mh", FlagSched1},
	"mh-port":     {"mh", FlagSched2},
}

// Names lists every scheduler ipvs-proxy knows, sorted.
func Names() []string {
	out := make([]string, 0, len(known))
	for n := range known {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Module returns the kernel module that provides a scheduler.
func Module(name string) (string, bool) {
	m, ok := known[name]
	return m, ok
}

// Validate checks a scheduler name.
func Validate(name string) error {
	if _, ok := known[name]; !ok {
		return fmt.Errorf("unknown IPVS scheduler %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return nil
}

// Spec is a scheduler with its flags, as programmed into a virtual server.
type Spec struct {
	Name  string
	Flags uint32
}

// ParseFlags turns a comma-separated flag list such as "sh-fallback,sh-port"
// into IPVS flag bits for the scheduler name.
func ParseFlags(name, list string) (uint32, error) {
	var bits uint32
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		def, ok := flags[f]
		if !ok {
			return 0, fmt.Errorf("unknown scheduler flag %q", f)
		}
		if def.scheduler != name {
			return 0, fmt.Errorf("scheduler flag %q applies to scheduler %q, not %q", f, def.scheduler, name)
		}
		bits |= def.bit
	}
	return bits, nil
}

// FromAnnotations resolves a Service's scheduler. Problems are reported as
// warnings, never as failures: an unknown scheduler falls back to def, and
// unknown or mismatched flags are dropped.
func FromAnnotations(annotations map[string]string, def Spec) (Spec, []string) {
	var warnings []string
	spec := def
	if name, ok := annotations[AnnotationScheduler]; ok {
		name = strings.TrimSpace(strings.ToLower(name))
		if err := Validate(name); err != nil {
			warnings = append(warnings, fmt.Sprintf("annotation %s: %v; using the default %q", AnnotationScheduler, err, def.Name))
		} else if name != def.Name {
			spec = Spec{Name: name}
		}
	}
	if list, ok := annotations[AnnotationFlags]; ok {
		bits, err := ParseFlags(spec.Name, list)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("annotation %s: %v; flags ignored", AnnotationFlags, err))
		} else {
			spec.Flags = bits
		}
	}
	return spec, warnings
}
