package upstream

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCommand(t *testing.T) {
	s := Suite{Dir: "/s"}
	args := []string{"--kubeconfig=/k", "--ginkgo.focus=x"}
	for _, tc := range []struct {
		name     string
		o        RunOptions
		wantBin  string
		wantArgs []string
		wantErr  bool
	}{
		{
			name:     "one process: e2e.test itself",
			o:        RunOptions{Timeout: time.Hour},
			wantBin:  "/s/e2e.test",
			wantArgs: []string{"--ginkgo.timeout=1h0m0s", "--ginkgo.no-color", "--kubeconfig=/k", "--ginkgo.focus=x"},
		},
		{
			name:     "parallel: Ginkgo's runner, e2e.test's flags after --",
			o:        RunOptions{Timeout: time.Hour, Procs: 3, Ginkgo: "/g/ginkgo"},
			wantBin:  "/g/ginkgo",
			wantArgs: []string{"--procs=3", "--timeout=1h0m0s", "--no-color", "/s/e2e.test", "--", "--kubeconfig=/k", "--ginkgo.focus=x"},
		},
		{
			name:     "one process, a second attempt for a failed test",
			o:        RunOptions{Timeout: time.Hour, FlakeAttempts: 2},
			wantBin:  "/s/e2e.test",
			wantArgs: []string{"--ginkgo.timeout=1h0m0s", "--ginkgo.no-color", "--ginkgo.flake-attempts=2", "--kubeconfig=/k", "--ginkgo.focus=x"},
		},
		{
			name:     "parallel, a second attempt: the runner's flag",
			o:        RunOptions{Timeout: time.Hour, Procs: 2, Ginkgo: "/g/ginkgo", FlakeAttempts: 2},
			wantBin:  "/g/ginkgo",
			wantArgs: []string{"--procs=2", "--timeout=1h0m0s", "--no-color", "--flake-attempts=2", "/s/e2e.test", "--", "--kubeconfig=/k", "--ginkgo.focus=x"},
		},
		{
			name:    "parallel without the runner",
			o:       RunOptions{Timeout: time.Hour, Procs: 2},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, got, err := s.command(tc.o, args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if bin != tc.wantBin {
				t.Errorf("program = %q, want %q", bin, tc.wantBin)
			}
			if diff := cmp.Diff(tc.wantArgs, got); diff != "" {
				t.Errorf("arguments (-want +got):\n%s", diff)
			}
		})
	}
}
