package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/config/v1alpha1"
)

// ipvs-proxy's own config file is an IPVSProxyConfiguration
// (config.ipvs-proxy.io/v1alpha1, package v1alpha1): the options in
// kube-proxy's groups (ipvs, conntrack, ...), each at the path its
// versioned tag in Options gives. It is decoded strictly by apimachinery's
// decoder; the fields the file sets then override the default options, as
// the flat file's keys do (null keeps the default), and the options are
// validated as the flat file's are, an error naming the file's field.

var versionedType = reflect.TypeOf(v1alpha1.IPVSProxyConfiguration{})

// versionedAPI decodes IPVSProxyConfiguration strictly; an unknown field
// that is a flat option's key is told where it moved.
func versionedAPI() (strictAPI, error) {
	api, err := newStrictAPI(v1alpha1.Kind, versionedType, v1alpha1.AddToScheme)
	if err != nil {
		return api, err
	}
	api.moved = map[string]string{}
	for name, f := range configFields() {
		if name != f.path {
			api.moved[name] = f.path
		}
	}
	return api, nil
}

// decodeVersioned decodes an IPVSProxyConfiguration (data, and j, the
// same as JSON).
func decodeVersioned(data, j []byte) (configFile, error) {
	cf := configFile{kind: v1alpha1.Kind, opts: DefaultOptions(), field: map[string]string{}}
	vc, leaves, err := decodeStrict[*v1alpha1.IPVSProxyConfiguration](versionedAPI, data, j)
	if err != nil {
		return cf, err
	}
	set, null := map[string]bool{}, map[string]bool{}
	for _, l := range leaves {
		set[l.path], null[l.path] = true, l.value == nil
	}
	for name, f := range configFields() {
		if set[f.path] {
			cf.keys = append(cf.keys, name)
			cf.field[name] = f.path
		}
	}
	slices.Sort(cf.keys)
	err = cf.setFromVersioned(vc, null)
	return cf, err
}

// versionedDoc is the JSON document of the options named by keys (their
// flat names) at their versioned paths: durations as strings such as
// "1m30s", no list as an empty one, the rest as it is.
func versionedDoc(o Options, keys []string) map[string]any {
	fields := configFields()
	v := reflect.ValueOf(o)
	leaves := make([]jsonLeaf, 0, len(keys))
	for _, k := range keys {
		f := fields[k]
		leaves = append(leaves, jsonLeaf{path: f.path, value: optionValue(v.Field(f.index))})
	}
	return jsonDoc(leaves)
}

// optionValue is an option's value as a config file writes it.
func optionValue(fv reflect.Value) any {
	switch {
	case fv.Type() == durationType:
		return fv.Interface().(fmt.Stringer).String()
	case fv.Kind() == reflect.Slice && fv.IsNil():
		return []string{} // null would keep the default
	}
	return fv.Interface()
}

// setFromVersioned sets the options of cf.keys, which vc sets, on cf.opts:
// vc's fields at their paths, read by the flat file's decoder; a path the
// file sets to null keeps the default.
func (cf *configFile) setFromVersioned(vc *v1alpha1.IPVSProxyConfiguration, null map[string]bool) error {
	b, err := json.Marshal(vc)
	if err != nil {
		return fmt.Errorf("read %s: %w", v1alpha1.Kind, err)
	}
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		return fmt.Errorf("read %s: %w", v1alpha1.Kind, err)
	}
	values := map[string]any{}
	for _, l := range jsonLeaves("", tree, nil) {
		values[l.path] = l.value
	}
	flat := map[string]json.RawMessage{}
	for _, k := range cf.keys {
		if null[cf.field[k]] {
			continue
		}
		raw, err := json.Marshal(values[cf.field[k]])
		if err != nil {
			return fmt.Errorf("read %s: %s: %w", v1alpha1.Kind, cf.field[k], err)
		}
		flat[k] = raw
	}
	if _, err := decodeOptions(flat, &cf.opts); err != nil {
		return fmt.Errorf("read %s: %w", v1alpha1.Kind, err)
	}
	return nil
}

// versionedYAML writes the options named by keys as an
// IPVSProxyConfiguration, apiVersion and kind first.
func versionedYAML(o Options, keys []string) ([]byte, error) {
	body, err := yaml.Marshal(versionedDoc(o, keys))
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", v1alpha1.Kind, err)
	}
	head := fmt.Sprintf("apiVersion: %s\nkind: %s\n", v1alpha1.GroupVersion(), v1alpha1.Kind)
	if len(keys) == 0 {
		return []byte(head), nil
	}
	return append([]byte(head), body...), nil
}

// Convert reads ipvs-proxy's flat config file (deprecated) and writes it
// as an IPVSProxyConfiguration: the options the file sets, at their
// paths, with the values it gives them (a list written as one
// comma-separated string becomes a list; comments are lost). The result
// is read back: it must give the same options.
func Convert(flat []byte) ([]byte, error) {
	cf, err := decodeConfigFile(flat)
	if err != nil {
		return nil, err
	}
	if cf.kind != "" {
		return nil, fmt.Errorf("it is of kind %s, not ipvs-proxy's flat options: there is nothing to convert", cf.kind)
	}
	out, err := versionedYAML(cf.opts, cf.keys)
	if err != nil {
		return nil, err
	}
	back, err := decodeConfigFile(out)
	if err != nil {
		return nil, fmt.Errorf("the %s written does not read back: %w", v1alpha1.Kind, err)
	}
	if !sameOptions(back.opts, cf.opts) {
		return nil, fmt.Errorf("the %s written reads back as other options", v1alpha1.Kind)
	}
	return out, nil
}

// ConvertFile is Convert of the config file at path.
func ConvertFile(path string) ([]byte, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	out, err := Convert(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return out, nil
}

// sameOptions tells whether a and b are the same options, an empty list
// the same as none.
func sameOptions(a, b Options) bool {
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := range va.NumField() {
		for _, f := range []reflect.Value{va.Field(i), vb.Field(i)} {
			if f.Kind() == reflect.Slice && f.Len() == 0 {
				f.SetZero()
			}
		}
	}
	return reflect.DeepEqual(a, b)
}
