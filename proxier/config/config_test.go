package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// resolveWith parses args (plus --config FILE when file is not nil) the way
// a command does and resolves the options.
func resolveWith(t *testing.T, file *string, args ...string) (*Options, string, error) {
	t.Helper()
	o, _, path, err := resolveWarn(t, file, args...)
	return o, path, err
}

// resolveWarn is resolveWith that also returns the warning.
func resolveWarn(t *testing.T, file *string, args ...string) (*Options, *Warning, string, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	of := NewFlags(fs)
	path := ""
	if file != nil {
		path = filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(*file), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	o, warn, err := of.Resolve()
	return o, warn, path, err
}

func str(s string) *string { return &s }

// checkOptions compares got with the defaults changed by change.
func checkOptions(t *testing.T, got *Options, change func(o *Options)) {
	t.Helper()
	want := DefaultOptions()
	change(&want)
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}

func TestConfigPrecedence(t *testing.T) {
	tests := []struct {
		name string
		file *string
		args []string
		// change the defaults into what is expected
		want func(o *Options)
	}{
		{name: "defaults", want: func(*Options) {}},
		{name: "flags only", args: []string{"--scheduler", "wrr", "--sync-period", "10s"},
			want: func(o *Options) { o.Scheduler, o.SyncPeriod = "wrr", 10*time.Second }},
		{name: "empty file", file: str(""), want: func(*Options) {}},
		{name: "comments only", file: str("# nothing set\n"), want: func(*Options) {}},
		{name: "file sets options", file: str(`
kubeconfig: /etc/ipvs-proxy/kubeconfig
scheduler: sh
schedulerFlags: sh-port
syncPeriod: 1m
minSyncPeriod: 250ms
tcpTimeout: 15m
nodePortAddresses: [10.0.0.0/8, "192.168.0.0/16"]
masqueradeAll: true
ipFamilies: [IPv4]
`), want: func(o *Options) {
			o.Kubeconfig, o.Scheduler, o.SchedulerFlags = "/etc/ipvs-proxy/kubeconfig", "sh", "sh-port"
			o.SyncPeriod, o.MinSyncPeriod, o.TCPTimeout = time.Minute, 250*time.Millisecond, 15*time.Minute
			o.NodePortAddresses, o.MasqueradeAll, o.IPFamilies = []string{"10.0.0.0/8", "192.168.0.0/16"}, true, []string{"IPv4"}
		}},
		{name: "a list as one comma-separated string", file: str("excludeCIDRs: 10.1.0.0/16, 10.2.0.0/16\n"),
			want: func(o *Options) { o.ExcludeCIDRs = []string{"10.1.0.0/16", "10.2.0.0/16"} }},
		{name: "null keeps the default", file: str("scheduler: null\nsyncPeriod: ~\n"), want: func(*Options) {}},
		{name: "flags override the file", file: str("scheduler: wrr\nsyncPeriod: 1m\nnodePortAddresses: [10.0.0.0/8]\nmasqueradeAll: true\n"),
			args: []string{"--scheduler", "lc", "--nodeport-addresses", "192.168.0.0/16,172.16.0.0/12", "--masquerade-all=false"},
			want: func(o *Options) {
				o.Scheduler, o.SyncPeriod = "lc", time.Minute
				o.NodePortAddresses = []string{"192.168.0.0/16", "172.16.0.0/12"} // replaced, not appended
			}},
		{name: "a flag set to the default value still wins", file: str("scheduler: wrr\nlogLevel: debug\n"),
			args: []string{"--scheduler", "rr"}, want: func(o *Options) { o.LogLevel = "debug" }},
		{name: "a flag fixes a value the file got wrong", file: str("scheduler: nope\n"), args: []string{"--scheduler", "sed"},
			want: func(o *Options) { o.Scheduler = "sed" }},
		{name: "flags fix a combination", file: str("scheduler: sh\nschedulerFlags: sh-port\n"),
			args: []string{"--scheduler", "mh", "--scheduler-flags", "mh-port"},
			want: func(o *Options) { o.Scheduler, o.SchedulerFlags = "mh", "mh-port" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := resolveWith(t, tt.file, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			checkOptions(t, got, tt.want)
		})
	}
}

// configErrorCase is a config file that does not load, and what the error
// says.
type configErrorCase struct {
	name string
	file string
	want []string // substrings of the error, which starts with the file's path
	not  []string
}

// testConfigErrors loads each file, which must fail with its error.
func testConfigErrors(t *testing.T, tests []configErrorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, path, err := resolveWith(t, &tt.file)
			if err == nil {
				t.Fatalf("no error for %q", tt.file)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config file "+path+": ") {
				t.Errorf("the error does not start with the file: %s", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(msg, w) {
					t.Errorf("error %q has %q", msg, w)
				}
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	testConfigErrors(t, []configErrorCase{
		{"unknown field, near a known one", "schedular: rr\n", []string{`unknown field "schedular" (did you mean "scheduler"?)`}, nil},
		{"unknown field, case differs", "SyncPeriod: 1s\n", []string{`unknown field "SyncPeriod" (did you mean "syncPeriod"?)`}, nil},
		{"unknown field, far from any", "frobnicate: true\n", []string{`unknown field "frobnicate" (known: acceptServiceTraffic, clusterCIDRs, `}, nil},
		{"duration as a number", "syncPeriod: 30\n", []string{"syncPeriod: want a duration such as 30s or 1m30s, got a number"}, nil},
		{"bad duration", "syncPeriod: soon\n", []string{`syncPeriod: "soon" is not a duration`}, nil},
		{"bool of the wrong type", "masqueradeAll: sometimes\n", []string{"masqueradeAll: want true or false, got a string"}, nil},
		{"list of the wrong type", "nodePortAddresses: {a: b}\n", []string{"nodePortAddresses: want a list of strings, got a mapping"}, nil},
		{"list of numbers", "ipFamilies: [4, 6]\n", []string{"ipFamilies: want a list of strings, got a list"}, nil},
		{"string of the wrong type", "scheduler: [rr]\n", []string{"scheduler: want a string, got a list"}, nil},
		{"unknown scheduler", "scheduler: fastest\n", []string{`scheduler: unknown IPVS scheduler "fastest"`}, []string{"--scheduler"}},
		{"flags of another scheduler", "schedulerFlags: sh-port\n", []string{`schedulerFlags: scheduler flag "sh-port" applies to scheduler "sh", not "rr"`}, nil},
		{"bad port range", "nodePortRange: 5-2\n", []string{`nodePortRange: "5-2" is not a port range`}, nil},
		{"bad CIDR", "excludeCIDRs: [10.0.0.0/33]\n", []string{`excludeCIDRs: "10.0.0.0/33" is not a CIDR`}, nil},
		{"bad externalIP CIDR", "externalIPCIDRs: [198.51.100.5]\n", []string{`externalIPCIDRs: "198.51.100.5" is not a CIDR`}, nil},
		{"bad cluster CIDR", "clusterCIDRs: [pods]\n", []string{`clusterCIDRs: "pods" is not a CIDR`}, nil},
		{"bad family", "ipFamilies: [IPv5]\n", []string{`ipFamilies: unknown family "IPv5"`}, nil},
		{"bad log level", "logLevel: loud\n", []string{"logLevel: "}, nil},
		{"bad log format", "logFormat: xml\n", []string{`logFormat: "xml" is neither json nor console`}, nil},
		{"bad iptables backend", "iptablesBackend: xt\n", []string{`iptablesBackend: "xt" is not auto, nft or legacy`}, nil},
		{"bad bind address", "metricsBindAddress: localhost\n", []string{`metricsBindAddress: "localhost" is not host:port`}, nil},
		{"long interface name", "interface: a-very-long-interface-name\n", []string{"interface: "}, nil},
		{"sync periods out of order", "minSyncPeriod: 1m\nsyncPeriod: 10s\n", []string{"minSyncPeriod: --min-sync-period (1m0s) must be between 0 and --sync-period (10s)"}, nil},
		{"several errors at once", "schedular: rr\nsyncPeriod: soon\n", []string{`unknown field "schedular"`, `syncPeriod: "soon"`}, nil},
		{"a list at the top", "- scheduler: rr\n", []string{"the top level must be a mapping of option names to values, not a list"}, nil},
		{"a scalar at the top", "rr\n", []string{"the top level must be a mapping of option names to values, not a string"}, nil},
		{"duplicate key", "scheduler: rr\nscheduler: wrr\n", []string{"not valid YAML", `"scheduler"`}, nil},
		{"not YAML", "scheduler: [rr\n", []string{"not valid YAML"}, nil},
		{"tabs", "scheduler:\trr\n\tsyncPeriod: 1s\n", []string{"not valid YAML"}, nil},
	})
}

func TestConfigFileErrors(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	of := NewFlags(fs)
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if err := fs.Parse([]string{"--config", missing}); err != nil {
		t.Fatal(err)
	}
	_, _, err := of.Resolve()
	if err == nil || err.Error() != "config file "+missing+": no such file or directory" {
		t.Errorf("a missing file: %v", err)
	}

	// Valid on its own, invalid with a flag: the error names both.
	file := "syncPeriod: 2s\n"
	_, path, err := resolveWith(t, &file, "--min-sync-period", "5s")
	if err == nil || !strings.Contains(err.Error(), "--min-sync-period (5s) must be between 0 and --sync-period (2s)") ||
		!strings.Contains(err.Error(), "config file "+path) {
		t.Errorf("an invalid merge: %v", err)
	}
}

// TestConfigEveryFlagReplays: every option flag given on the command line
// wins over the file. A flag of a type replayFlags does not know fails
// here, so that adding one cannot silently lose precedence.
func TestConfigEveryFlagReplays(t *testing.T) {
	probe := pflag.NewFlagSet("probe", pflag.ContinueOnError)
	NewFlags(probe)
	probe.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		t.Run(f.Name, func(t *testing.T) {
			var value string
			switch f.Value.Type() {
			case "string":
				value = "v-" + f.Name
			case "bool":
				value = "true"
				if f.DefValue == "true" {
					value = "false"
				}
			case "duration":
				value = "7s"
			case "stringSlice":
				value = "a,b"
			case "int", "int32", "int64", "uint", "uint16", "uint32", "uint64":
				value = "7"
			default:
				t.Fatalf("flag --%s has type %s, which this test (and replayFlags) should be taught", f.Name, f.Value.Type())
			}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			of := NewFlags(fs)
			if err := fs.Parse([]string{"--" + f.Name + "=" + value}); err != nil {
				t.Fatal(err)
			}
			// A "file" that sets every field to something else.
			fromFile := DefaultOptions()
			v := reflect.ValueOf(&fromFile).Elem()
			for i := 0; i < v.NumField(); i++ {
				switch fv := v.Field(i); {
				case fv.Type() == durationType:
					fv.SetInt(int64(3 * time.Hour))
				case fv.Kind() == reflect.String:
					fv.SetString("from-file")
				case fv.Kind() == reflect.Bool:
					fv.SetBool(!fv.Bool())
				case fv.Kind() == reflect.Int:
					fv.SetInt(fv.Int() + 1000)
				case fv.Kind() == reflect.Slice:
					fv.Set(reflect.ValueOf([]string{"from-file"}))
				}
			}
			if err := replayFlags(fs, &fromFile); err != nil {
				t.Fatal(err)
			}
			// Exactly one field left the file's value for the flag's: the
			// flag's own.
			same := 0
			want := reflect.ValueOf(of.opts)
			for i := 0; i < v.NumField(); i++ {
				if reflect.DeepEqual(v.Field(i).Interface(), want.Field(i).Interface()) {
					same++
				}
			}
			if same != 1 {
				t.Errorf("--%s=%s: %d fields took the flag's value, want 1", f.Name, value, same)
			}
		})
	})
}
