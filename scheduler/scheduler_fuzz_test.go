package scheduler

import (
	"strings"
	"testing"
)

// fuzzFlagBits is what each flag of each scheduler sets, written out here
// rather than read from the package's table so that the fuzz test checks
// the table too.
var fuzzFlagBits = map[string]map[string]uint32{
	"sh": {"sh-fallback": FlagSched1, "sh-port": FlagSched2},
	"mh": {"mh-fallback": FlagSched1, "mh-port": FlagSched2},
}

// FuzzSchedulerAnnotations: whatever a Service's annotations say,
// FromAnnotations resolves a known scheduler with flags of that scheduler
// only, and gives what was asked for unless it warns. The default is a
// valid one, as the command line's validation guarantees.
func FuzzSchedulerAnnotations(f *testing.F) {
	f.Add("sh", "sh-fallback, sh-port", true, true, uint8(0), "")
	f.Add(" MH ", "mh-port", true, true, uint8(3), "")
	f.Add("fastest", "", true, false, uint8(0), "")
	f.Add("rr", "sh-port", true, true, uint8(0), "")
	f.Add("", "turbo,,", false, true, uint8(11), "sh-port")
	f.Add("sh", "", true, false, uint8(11), "sh-fallback,sh-port")
	f.Add("mh", "", true, false, uint8(11), "sh-port")
	f.Add("sh", ",", true, true, uint8(11), "sh-port")
	f.Fuzz(func(t *testing.T, name, flagList string, hasName, hasFlags bool, defIndex uint8, defFlags string) {
		names := Names()
		def := Spec{Name: names[int(defIndex)%len(names)]}
		if bits, err := ParseFlags(def.Name, defFlags); err == nil {
			def.Flags = bits
		}
		ann := map[string]string{"unrelated": name}
		if hasName {
			ann[AnnotationScheduler] = name
		}
		if hasFlags {
			ann[AnnotationFlags] = flagList
		}

		got, warnings := FromAnnotations(ann, def)

		if err := Validate(got.Name); err != nil {
			t.Fatalf("resolved an unknown scheduler: %v", err)
		}
		var allowed uint32
		for _, bit := range fuzzFlagBits[got.Name] {
			allowed |= bit
		}
		if got.Flags&^allowed != 0 || got.Flags&^(FlagSched1|FlagSched2|FlagSched3) != 0 {
			t.Fatalf("flags %#x are not all flags of %q (allowed %#x)", got.Flags, got.Name, allowed)
		}
		for _, w := range warnings {
			if !strings.Contains(w, AnnotationScheduler) && !strings.Contains(w, AnnotationFlags) {
				t.Errorf("warning %q names no annotation", w)
			}
		}

		// What was asked for: the annotated scheduler (else the default),
		// with the annotated flags (else the default's flags when it is
		// the default scheduler, none otherwise).
		wantName := def.Name
		if hasName {
			wantName = strings.ToLower(strings.TrimSpace(name))
		}
		if got.Name != wantName {
			if len(warnings) == 0 {
				t.Fatalf("asked for %q, got %+v without a warning", wantName, got)
			}
			return
		}
		wantFlags, flagsOK := uint32(0), true
		switch {
		case hasFlags:
			for _, f := range strings.Split(flagList, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				bit, ok := fuzzFlagBits[got.Name][f]
				flagsOK = flagsOK && ok
				wantFlags |= bit
			}
		case got.Name == def.Name:
			wantFlags = def.Flags
		}
		if (!flagsOK || got.Flags != wantFlags) && len(warnings) == 0 {
			t.Fatalf("asked for %q with flags %q (valid %v, %#x), got %+v without a warning", wantName, flagList, flagsOK, wantFlags, got)
		}
		if flagsOK && got.Flags == wantFlags && len(warnings) != 0 {
			t.Fatalf("got what was asked for (%+v) but warned %q", got, warnings)
		}
	})
}
