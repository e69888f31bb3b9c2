package scheduler

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFromAnnotations(t *testing.T) {
	def := Spec{Name: "rr"}
	tests := []struct {
		name     string
		ann      map[string]string
		want     Spec
		warnings []string // substrings, one per expected warning
	}{
		{"none", nil, def, nil},
		{"sh", map[string]string{AnnotationScheduler: "sh"}, Spec{Name: "sh"}, nil},
		{"case and space", map[string]string{AnnotationScheduler: " LC "}, Spec{Name: "lc"}, nil},
		{"sh with flags", map[string]string{AnnotationScheduler: "sh", AnnotationFlags: "sh-fallback, sh-port"},
			Spec{Name: "sh", Flags: FlagSched1 | FlagSched2}, nil},
		{"mh port", map[string]string{AnnotationScheduler: "mh", AnnotationFlags: "mh-port"},
			Spec{Name: "mh", Flags: FlagSched2}, nil},
		{"unknown scheduler", map[string]string{AnnotationScheduler: "fastest"}, def, []string{`unknown IPVS scheduler "fastest"`}},
		{"flag of other scheduler", map[string]string{AnnotationScheduler: "rr", AnnotationFlags: "sh-port"},
			def, []string{`applies to scheduler "sh"`}},
		{"unknown flag", map[string]string{AnnotationScheduler: "sh", AnnotationFlags: "turbo"},
			Spec{Name: "sh"}, []string{`unknown scheduler flag "turbo"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, warnings := FromAnnotations(tc.ann, def)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings = %q, want %d matching %q", warnings, len(tc.warnings), tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %q does not contain %q", warnings[i], w)
				}
			}
		})
	}
}

func TestModuleForEveryName(t *testing.T) {
	for _, n := range Names() {
		if m, ok := Module(n); !ok || m != "ip_vs_"+n {
			t.Errorf("Module(%q) = %q, %v", n, m, ok)
		}
	}
	if err := Validate("bogus"); err == nil {
		t.Error("Validate(bogus) = nil")
	}
}
