package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/config/v1alpha1"
)

// configFuzzSeeds are config files for both fuzz tests.
var configFuzzSeeds = []string{
	"",
	"# nothing set\n",
	"kubeconfig: /etc/ipvs-proxy/kubeconfig\nscheduler: sh\nschedulerFlags: sh-port\nsyncPeriod: 1m\nminSyncPeriod: 250ms\n" +
		"tcpTimeout: 15m\nnodePortAddresses: [10.0.0.0/8, \"192.168.0.0/16\"]\nmasqueradeAll: true\nipFamilies: [IPv4]\n",
	"excludeCIDRs: 10.1.0.0/16, 10.2.0.0/16\nclusterCIDRs: [10.244.0.0/16, 'fd00:10:244::/56']\nstrictARP: yes\n",
	"scheduler: null\nsyncPeriod: ~\nlogLevel: debug\nlogFormat: console\niptablesBackend: nft\n",
	"nodePortRange: 5-2\nmetricsBindAddress: localhost\nhealthzBindAddress: ''\ninterface: a-very-long-interface-name\n",
	"minSyncPeriod: 1m\nsyncPeriod: 10s\nudpTimeout: 500ms\ntcpFinTimeout: -1s\n",
	"schedular: rr\nsyncPeriod: 30\nmasqueradeAll: sometimes\nipFamilies: [4, 6]\n",
	"- scheduler: rr\n",
	"scheduler: rr\nscheduler: wrr\n",
	"{scheduler: mh, schedulerFlags: 'mh-port,mh-fallback', hostnameOverride: Node-1, ipFamilies: IPv6}\n",
	"base: &b {scheduler: rr}\n<<: *b\n",
	"hostnameOverride: \"n\\x7f\\u0085\\t\\u2028\\U0001F600\\0\"\nkubeconfig: \"\\xff\"\ninterface: \" eth0\"\n",
	"{\"scheduler\": \"wlc\", \"ipFamilies\": [\"IPv4\", null], \"syncPeriod\": \" 1h \", \"tcpTimeout\": \"0\"}",
	// IPVSProxyConfiguration
	"apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\n",
	"apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nclientConnection: {kubeconfig: /etc/ipvs-proxy/kubeconfig}\n" +
		"ipvs:\n  scheduler: sh\n  schedulerFlags: sh-port\n  syncPeriod: 1m\n  excludeCIDRs: [10.1.0.0/16]\n" +
		"conntrack: {maxPerCore: 0, min: 1000, tcpBeLiberal: true}\nlogging: {level: debug, format: console}\nipFamilies: [IPv4]\n",
	"apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nipvs: null\ndetectLocal: {}\niptables: {backend: null}\n",
	"apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\nscheduler: rr\nipvs: {schedular: rr, syncPeriod: 30}\nconntrack: {min: 99999999999}\n",
	"{\"apiVersion\": \"config.ipvs-proxy.io/v1alpha1\", \"kind\": \"IPVSProxyConfiguration\", \"hostnameOverride\": \"n\\u0085\", \"ipvs\": {\"interface\": \"eth0\"}}",
	"apiVersion: config.ipvs-proxy.io/v1beta1\nkind: IPVSProxyConfiguration\n",
}

// FuzzConfigFile: whatever the config file holds, decoding does not panic;
// the options resolve to an error that names the file or to options that
// validate and are what decodeConfigFile read; and options that decode,
// written back as YAML under their json names and as an
// IPVSProxyConfiguration, decode to the same options, and a flat file
// converts to an IPVSProxyConfiguration of the same options.
func FuzzConfigFile(f *testing.F) {
	for _, s := range configFuzzSeeds {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "config.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		cf, decodeErr := decodeConfigFile(data)
		decoded, keys := cf.opts, cf.keys

		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		of := NewFlags(fs)
		if err := fs.Parse([]string{"--config", path}); err != nil {
			t.Fatal(err)
		}
		resolved, warn, err := of.Resolve()
		switch {
		case err != nil:
			// No flag was given: the file alone is to blame, by its name.
			if !strings.HasPrefix(err.Error(), "config file "+path+": ") {
				t.Fatalf("the error does not start with the file's name: %v", err)
			}
		case decodeErr != nil:
			t.Fatalf("decodeConfigFile failed (%v) but the options resolved", decodeErr)
		case !cmp.Equal(*resolved, decoded):
			t.Fatalf("resolved options differ from the decoded ones (-decoded +resolved):\n%s", cmp.Diff(decoded, *resolved))
		default:
			if err := resolved.validate(); err != nil {
				t.Fatalf("resolved options do not validate: %v", err)
			}
			// One deprecation warning, for a flat file that sets options.
			if deprecated := warn != nil && warn.Deprecated != ""; deprecated != (cf.kind == "" && len(keys) > 0) {
				t.Fatalf("file of kind %q with %d options: warning %v", cf.kind, len(keys), warn)
			}
		}
		if decodeErr != nil {
			return
		}

		fields := configFields()
		if !slices.IsSorted(keys) || len(slices.Compact(slices.Clone(keys))) != len(keys) {
			t.Fatalf("keys %q are not sorted and unique", keys)
		}
		for _, k := range keys {
			if _, ok := fields[k]; !ok {
				t.Fatalf("decoded an unknown key %q", k)
			}
			if cf.kind == v1alpha1.Kind && cf.field[k] != fields[k].path {
				t.Fatalf("option %s set by %q, not by its path %s", k, cf.field[k], fields[k].path)
			}
		}

		// Written back as JSON (flow YAML) and as block YAML. A file may
		// hold control characters U+007F to U+009F in double quotes, but
		// YAML allows them only escaped, and encoding/json writes them
		// raw: yaml.Marshal, which goes through JSON, refuses most and
		// turns NEL (U+0085) into a line break. So the JSON escapes them,
		// and block YAML is checked only without them.
		m := configAsMap(decoded)
		checkWrittenBack(t, decoded, "", m, func() ([]byte, error) { return yaml.Marshal(m) })
		if !fitsVersioned(decoded) {
			return
		}
		all := slices.Sorted(maps.Keys(fields))
		doc := versionedDoc(decoded, all)
		doc["apiVersion"], doc["kind"] = v1alpha1.GroupVersion().String(), v1alpha1.Kind
		checkWrittenBack(t, decoded, v1alpha1.Kind, doc, func() ([]byte, error) { return versionedYAML(decoded, all) })

		if cf.kind != "" || strings.ContainsFunc(fmt.Sprint(decoded), isC1) {
			return
		}
		conv, err := Convert(data)
		if err != nil {
			t.Fatalf("a flat file that decodes does not convert: %v", err)
		}
		back, err := decodeConfigFile(conv)
		if err != nil || back.kind != v1alpha1.Kind || !slices.Equal(back.keys, keys) {
			t.Fatalf("converted: kind %q, keys %q, want %q; %v\n%s", back.kind, back.keys, keys, err, conv)
		}
		if diff := cmp.Diff(decoded, back.opts, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("converted, the options differ (-flat +versioned):\n%s\n%s", diff, conv)
		}
	})
}

// checkWrittenBack checks that doc, the options want as a file of kind
// kind ("" for the flat options), decodes to want when written as JSON,
// and as block YAML (by asYAML) when it holds no control character U+007F
// to U+009F.
func checkWrittenBack(t *testing.T, want Options, kind string, doc map[string]any, asYAML func() ([]byte, error)) {
	t.Helper()
	asJSON, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	outs := [][]byte{escapeC1(asJSON)}
	if !bytes.ContainsFunc(asJSON, isC1) {
		out, err := asYAML()
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	for _, out := range outs {
		back, err := decodeConfigFile(out)
		if err != nil {
			t.Fatalf("options written back do not decode: %v\n%s", err, out)
		}
		if back.kind != kind {
			t.Fatalf("options written back as kind %q decode as kind %q", kind, back.kind)
		}
		if diff := cmp.Diff(want, back.opts, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("options written back decode differently (-first +again):\n%s\n%s", diff, out)
		}
	}
}

// fitsVersioned tells whether o's integers fit in the int32 fields of an
// IPVSProxyConfiguration (the flat file's are ints).
func fitsVersioned(o Options) bool {
	v := reflect.ValueOf(o)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Int && f.Int() != int64(int32(f.Int())) {
			return false
		}
	}
	return true
}

func isC1(r rune) bool { return r >= 0x7f && r <= 0x9f }

// escapeC1 writes the control characters U+007F to U+009F of JSON text as
// \u escapes (they only occur inside strings).
func escapeC1(j []byte) []byte {
	var b strings.Builder
	for _, r := range string(j) {
		if isC1(r) {
			fmt.Fprintf(&b, "\\u%04x", r)
		} else {
			b.WriteRune(r)
		}
	}
	return []byte(b.String())
}

// configAsMap is the options as a config file writes them: every field
// under its json name, durations as strings such as "1m30s".
func configAsMap(o Options) map[string]any {
	v := reflect.ValueOf(o)
	out := map[string]any{}
	for name, f := range configFields() {
		out[name] = optionValue(v.Field(f.index))
	}
	return out
}

// FuzzFlags: whatever the command line of `ipvs-proxy run` holds (one
// argument a line; "@CONFIG" stands for a config file with the second
// input), parsing does not panic and the options resolve to an error or to
// options that validate, in which every flag given has its value.
func FuzzFlags(f *testing.F) {
	f.Add("", []byte(nil))
	f.Add("--scheduler\nsh\n--scheduler-flags=sh-port,sh-fallback\n--sync-period\n10s", []byte(nil))
	f.Add("--config\n@CONFIG\n--scheduler\nlc\n--nodeport-addresses\n192.168.0.0/16,172.16.0.0/12\n--masquerade-all=false",
		[]byte("scheduler: wrr\nsyncPeriod: 1m\nnodePortAddresses: [10.0.0.0/8]\nmasqueradeAll: true\n"))
	f.Add("--config=@CONFIG\n--min-sync-period\n5s", []byte("syncPeriod: 2s\n"))
	f.Add("--config\n@CONFIG\n--scheduler\nsed", []byte("scheduler: nope\n"))
	f.Add("--exclude-cidrs\n10.0.0.0/8\n--exclude-cidrs=fd00::/8\n--ip-families\nipv6\n--strict-arp\n--ipvs-udp-timeout\n0", []byte(nil))
	f.Add("--log-level=debug\n--log-format\nconsole\n--iptables-backend\nlegacy\n--healthz-bind-address=\n--interface\neth0", []byte(nil))
	f.Add("--service-node-port-range\n1-65535\n--hostname-override\nNODE\n--cluster-cidr\n10.244.0.0/16\n--\nextra", []byte(nil))
	f.Add("-h\n--unknown\n--sync-period\nsoon\n--masquerade-all=maybe\n--scheduler", []byte(nil))
	path := filepath.Join(f.TempDir(), "config.yaml")
	f.Fuzz(func(t *testing.T, args string, file []byte) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\n")
		}
		for i := range argv {
			argv[i] = strings.ReplaceAll(argv[i], "@CONFIG", path)
		}
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		of := NewFlags(fs)
		if err := fs.Parse(argv); err != nil {
			return
		}
		o, _, err := of.Resolve()
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if err := o.validate(); err != nil {
			t.Fatalf("resolved options do not validate: %v", err)
		}
		if of.configFile == "" && !cmp.Equal(*o, of.opts) {
			t.Fatalf("without a config file the options are not the flags' (-flags +resolved):\n%s", cmp.Diff(of.opts, *o))
		}
		// Every option flag given wins over the file.
		probe := pflag.NewFlagSet("probe", pflag.ContinueOnError)
		got := *o
		got.addFlags(probe)
		fs.Visit(func(fl *pflag.Flag) {
			if p := probe.Lookup(fl.Name); p != nil && p.Value.String() != fl.Value.String() {
				t.Errorf("--%s=%s was given but the options hold %s", fl.Name, fl.Value, p.Value)
			}
		})
	})
}
