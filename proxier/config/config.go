package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config/v1alpha1"
)

// The config file (--config) is YAML with the same settings as the flags.
// Values start from the defaults, the file overrides them, and flags given
// on the command line override the file. The file is one of:
//
//   - ipvs-proxy's IPVSProxyConfiguration (config.ipvs-proxy.io/v1alpha1,
//     versioned.go): the options in kube-proxy's groups;
//   - kube-proxy's KubeProxyConfiguration (kubeproxy.go), translated;
//   - deprecated: ipvs-proxy's flat options, with no apiVersion and kind,
//     keyed by the json names of the options' fields (kubeconfig,
//     scheduler, syncPeriod, ...). It is decoded here field by field, so
//     that an error says what a value must look like and a list may be one
//     comma-separated string, as on the command line; it loads with one
//     warning that names the versioned form (Convert writes it).

// Flags binds the options to a command's flags, with --config.
type Flags struct {
	opts       Options
	fs         *pflag.FlagSet
	configFile string
}

// NewFlags adds the option flags and --config to fs.
func NewFlags(fs *pflag.FlagSet) *Flags {
	of := &Flags{opts: DefaultOptions(), fs: fs}
	of.opts.addFlags(fs)
	fs.StringVar(&of.configFile, "config", "", "YAML file of options: an IPVSProxyConfiguration (apiVersion "+v1alpha1.GroupVersion().String()+"), kube-proxy's KubeProxyConfiguration, or (deprecated) the options keyed by their camelCase names; flags on the command line override it.")
	return of
}

// Resolve returns the validated options: the defaults, overridden by the
// config file, overridden by the flags set on the command line; and the
// one warning about the settings of the file that ipvs-proxy ignores (nil
// when there are none).
func (of *Flags) Resolve() (*Options, *Warning, error) {
	o := of.opts
	if of.configFile == "" {
		if err := o.validate(); err != nil {
			return nil, nil, err
		}
		return &o, nil, nil
	}
	cf, err := readConfigFile(of.configFile)
	if err != nil {
		return nil, nil, err
	}
	o = cf.opts
	if err := replayFlags(of.fs, &o); err != nil {
		return nil, nil, err
	}
	if err := o.validate(); err != nil {
		// Blame the file's own fields when they are wrong by themselves
		// (a flag may have fixed a bad value, so only when the merge fails).
		if ferr := cf.validateFields(); ferr != nil {
			return nil, nil, fmt.Errorf("config file %s: %w", of.configFile, ferr)
		}
		return nil, nil, fmt.Errorf("%w (options from the command line and config file %s)", err, of.configFile)
	}
	var warn *Warning
	if len(cf.ignored) > 0 || cf.deprecated != "" {
		warn = &Warning{File: of.configFile, Kind: cf.kind, Ignored: cf.ignored, Deprecated: cf.deprecated}
	}
	return &o, warn, nil
}

// ResolveReport is Resolve for the commands that print a report (preflight,
// status): it also checks --output and derives the proxier's configuration.
func (of *Flags) ResolveReport(output string) (*Options, agent.Config, *Warning, error) {
	if output != "table" && output != "json" {
		return nil, agent.Config{}, nil, fmt.Errorf("--output: %q is neither table nor json", output)
	}
	o, warn, err := of.Resolve()
	if err != nil {
		return nil, agent.Config{}, nil, err
	}
	cfg, _, err := o.ProxierConfig()
	if err != nil {
		return nil, agent.Config{}, nil, err
	}
	return o, cfg, warn, nil
}

// configFile is what a config file sets.
type configFile struct {
	kind string   // IPVSProxyConfiguration, KubeProxyConfiguration, or "" for the flat options
	opts Options  // the defaults, overridden by the file
	keys []string // the options the file sets, by json name
	// field names an option as the file spells it where that differs from
	// the option's json name (ipvs.scheduler for scheduler).
	field map[string]string
	// ignored are the settings the file sets that ipvs-proxy does not
	// apply, as "path: value".
	ignored []string
	// deprecated says what replaces the file's form, when it is
	// deprecated.
	deprecated string
}

// Warning is the one warning about a config file: the settings it
// sets that ipvs-proxy does not apply, or that its form is deprecated.
type Warning struct {
	File    string
	Kind    string // "" for the flat options
	Ignored []string
	// Deprecated says what replaces the file's form; "" when it is not
	// deprecated.
	Deprecated string
}

// String is the warning as one line.
func (w *Warning) String() string {
	var parts []string
	if w.Deprecated != "" {
		parts = append(parts, w.Deprecated)
	}
	if len(w.Ignored) > 0 {
		parts = append(parts, fmt.Sprintf("ipvs-proxy ignores %d setting(s) it does not support: %s",
			len(w.Ignored), strings.Join(w.Ignored, "; ")))
	}
	file := "config file " + w.File
	if w.Kind != "" {
		file += " (" + w.Kind + ")"
	}
	return file + ": " + strings.Join(parts, "; ")
}

// Remedy says what to do about the warning.
func (w *Warning) Remedy() string {
	if w.Deprecated != "" {
		return "convert the file: ipvs-proxy config convert --config " + w.File
	}
	return "ipvs-proxy has no equivalent of these settings: drop them, or accept that they have no effect"
}

// flatDeprecation is the warning about a flat options file.
func flatDeprecation() string {
	return fmt.Sprintf("ipvs-proxy's flat options (no apiVersion and kind) are deprecated: write apiVersion: %s, kind: %s, with the options in their groups (ipvs-proxy config convert prints the file so)",
		v1alpha1.GroupVersion(), v1alpha1.Kind)
}

// readFile reads the config file at path.
func readFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return data, nil
}

// readConfigFile reads and decodes the config file at path.
func readConfigFile(path string) (configFile, error) {
	data, err := readFile(path)
	if err != nil {
		return configFile{}, err
	}
	cf, err := decodeConfigFile(data)
	if err != nil {
		return configFile{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return cf, nil
}

// decodeConfigFile decodes a config file: by its apiVersion and kind, an
// IPVSProxyConfiguration or kube-proxy's KubeProxyConfiguration; without
// them, the flat options. YAML that is not valid or has a duplicate key is
// an error in all.
func decodeConfigFile(data []byte) (configFile, error) {
	cf := configFile{opts: DefaultOptions()}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return cf, fmt.Errorf("not valid YAML: %w", err)
	}
	j = bytes.TrimSpace(j)
	if len(j) == 0 || string(j) == "null" {
		return cf, nil // an empty file
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(j, &m); err != nil {
		return cf, fmt.Errorf("the top level must be a mapping of option names to values, not %s", jsonKind(j))
	}
	_, hasVersion := m["apiVersion"]
	_, hasKind := m["kind"]
	if !hasVersion && !hasKind {
		cf.keys, err = decodeOptions(m, &cf.opts)
		if len(cf.keys) > 0 {
			cf.deprecated = flatDeprecation()
		}
		return cf, err
	}
	return decodeTyped(data, j)
}

// decodeTyped decodes a config file that has an apiVersion or a kind (data,
// and j, the same as JSON) by them.
func decodeTyped(data, j []byte) (configFile, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return configFile{}, fmt.Errorf("apiVersion and kind must be strings: %w", err)
	}
	kubeProxy := kubeproxyconfig.SchemeGroupVersion.WithKind(kubeProxyKind)
	switch tm.GroupVersionKind() {
	case v1alpha1.GroupVersionKind():
		return decodeVersioned(data, j)
	case kubeProxy:
		return decodeKubeProxyConfig(data, j)
	}
	return configFile{}, fmt.Errorf("apiVersion %q, kind %q is not a configuration ipvs-proxy reads: that is kind %s, apiVersion %s, or ipvs-proxy's own options, without apiVersion and kind (deprecated) or of kind %s, apiVersion %s",
		tm.APIVersion, tm.Kind, kubeProxy.Kind, kubeProxy.GroupVersion(), v1alpha1.Kind, v1alpha1.GroupVersion())
}

// replayFlags sets on o every option flag that was set on fs.
func replayFlags(fs *pflag.FlagSet, o *Options) error {
	replay := pflag.NewFlagSet("replay", pflag.ContinueOnError)
	o.addFlags(replay)
	var errs []error
	fs.Visit(func(f *pflag.Flag) {
		to := replay.Lookup(f.Name)
		if to == nil {
			return // not an option (--config, --output, ...)
		}
		from, fromSlice := f.Value.(pflag.SliceValue)
		dst, dstSlice := to.Value.(pflag.SliceValue)
		var err error
		if fromSlice && dstSlice {
			err = dst.Replace(from.GetSlice())
		} else {
			err = to.Value.Set(f.Value.String())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
		}
	})
	return errors.Join(errs...)
}

// configField is one option as the config file names it.
type configField struct {
	index int    // in options
	path  string // in an IPVSProxyConfiguration, dotted
}

// configFields lists the options' fields by their json names (their keys
// in the flat file).
func configFields() map[string]configField {
	t := reflect.TypeOf(Options{})
	out := map[string]configField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		out[name] = configField{index: i, path: f.Tag.Get("versioned")}
	}
	return out
}

var (
	durationType        = reflect.TypeOf(time.Duration(0))
	metaDurationType    = reflect.TypeOf(metav1.Duration{})
	jsonUnmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

// describeType says what a config value must look like.
func describeType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType || t == metaDurationType:
		return "a duration such as 30s or 1m30s"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "a list of strings"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "an integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Map,
		t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(jsonUnmarshalerType):
		return "a mapping"
	}
	return "a value of type " + t.String()
}

// jsonKind names the kind of a JSON value for error messages.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "a mapping"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// decodeOptions decodes ipvs-proxy's own options onto o, strictly: unknown
// keys and values of the wrong type are errors naming the key. It returns
// the keys it set.
func decodeOptions(m map[string]json.RawMessage, o *Options) ([]string, error) {
	fields := configFields()
	keys := slices.Sorted(maps.Keys(m))
	v := reflect.ValueOf(o).Elem()
	var errs []error
	for _, k := range keys {
		f, ok := fields[k]
		if !ok {
			errs = append(errs, unknownField("", k, slices.Collect(maps.Keys(fields))))
			continue
		}
		if err := decodeValue(m[k], v.Field(f.index)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
	}
	return keys, joinErrors(errs)
}

// joinErrors joins errors on one line, so that each follows the file's name.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return fmt.Errorf("%d errors: %s", len(errs), strings.Join(msgs, "; "))
}

// unknownField is the error for a key k that is none of known, the names
// beside it; prefix is the path to them ("ipvs.").
func unknownField(prefix, k string, known []string) error {
	best, bestDist := "", 3 // suggest a name at most 2 edits away
	for _, n := range known {
		if d := editDistance(strings.ToLower(n), strings.ToLower(k)); d < bestDist || (d == bestDist && n < best) {
			best, bestDist = n, d
		}
	}
	if best != "" {
		return fmt.Errorf("unknown field %q (did you mean %q?)", prefix+k, prefix+best)
	}
	known = slices.Sorted(slices.Values(known))
	return fmt.Errorf("unknown field %q (known: %s)", prefix+k, strings.Join(known, ", "))
}

// editDistance is the Levenshtein distance of two strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeValue sets one field from its JSON value. null keeps the default;
// durations are strings such as "30s"; a list of strings may also be
// written as one comma-separated string, as on the command line.
func decodeValue(raw json.RawMessage, dst reflect.Value) error {
	if jsonKind(raw) == "null" {
		return nil
	}
	t := dst.Type()
	switch {
	case t == durationType:
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("want %s, got %s", describeType(t), jsonKind(raw))
		}
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not %s", s, describeType(t))
		}
		dst.SetInt(int64(d))
		return nil
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String && jsonKind(raw) == "a string":
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		dst.Set(reflect.ValueOf(splitList(s)).Convert(t))
		return nil
	}
	p := reflect.New(t)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p.Interface()); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("want %s, got %s", describeType(t), jsonKind(raw))
		}
		return err
	}
	dst.Set(p.Elem())
	return nil
}

// splitList splits a comma-separated list, as pflag's string slices are
// written, dropping empty items.
func splitList(s string) []string {
	var list []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			list = append(list, part)
		}
	}
	return list
}

// configFieldGroups are options validated together: one is meaningless
// without the other.
func configFieldGroups() [][]string {
	return [][]string{{"scheduler", "schedulerFlags"}, {"minSyncPeriod", "syncPeriod"}}
}

// flagPrefix is the "--flag-name: " that validation errors start with; a
// config file error names the field instead.
var flagPrefix = regexp.MustCompile(`^--[a-z0-9-]+: `)

// validateFields validates each value the file sets on its own (with its
// group), so that an error names the file's field rather than a flag.
func (cf *configFile) validateFields() error {
	fields := configFields()
	fv := reflect.ValueOf(cf.opts)
	var errs []error
	done := map[string]bool{}
	for _, k := range cf.keys {
		if done[k] {
			continue
		}
		group := []string{k}
		for _, g := range configFieldGroups() {
			if slices.Contains(g, k) {
				group = g
			}
		}
		probe := DefaultOptions()
		pv := reflect.ValueOf(&probe).Elem()
		for _, name := range group {
			done[name] = true
			f := fields[name]
			pv.Field(f.index).Set(fv.Field(f.index))
		}
		if err := probe.validate(); err != nil {
			msg := flagPrefix.ReplaceAllString(err.Error(), "")
			name := k
			if n, ok := cf.field[k]; ok {
				name = n
			}
			errs = append(errs, fmt.Errorf("%s: %s", name, msg))
		}
	}
	return joinErrors(errs)
}

// validate checks every option that has a fixed form, as run does.
func (o *Options) validate() error {
	cfg, _, err := o.ProxierConfig()
	if err != nil {
		return err
	}
	if _, err := o.GlueConfig(cfg); err != nil {
		return err
	}
	if _, err := NewLogger(o.LogLevel, o.LogFormat); err != nil {
		return err
	}
	if err := o.Conntrack().Validate(); err != nil {
		return err
	}
	for _, a := range []struct{ flag, addr string }{
		{"metrics-bind-address", o.MetricsBindAddress}, {"healthz-bind-address", o.HealthzBindAddress},
		{"debug-bind-address", o.DebugBindAddress},
	} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("--%s: %q is not host:port: %w", a.flag, a.addr, err)
		}
	}
	return nil
}
