package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// A config file with an apiVersion and a kind is decoded strictly by
// apimachinery's decoder for its type (kube-proxy's
// KubeProxyConfiguration, kubeproxy.go): an unknown or duplicate field is
// an error. The decoder's errors are turned into ones that name every
// field at fault and say what its value must look like.

// strictAPI is a configuration type decoded strictly.
type strictAPI struct {
	kind string       // the type's kind, for messages
	typ  reflect.Type // the Go type, a struct
	dec  runtime.Decoder
	// moved maps a top-level field that is unknown to where the type
	// has it (the flat options' keys in an IPVSProxyConfiguration).
	moved map[string]string
}

// newStrictAPI is the strict decoder of the types that add registers, of
// which typ, of kind kind, is the one decoded: without conversion or
// defaulting.
func newStrictAPI(kind string, typ reflect.Type, add func(*runtime.Scheme) error) (strictAPI, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return strictAPI{}, fmt.Errorf("register %s: %w", kind, err)
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	return strictAPI{kind: kind, typ: typ, dec: dec}, nil
}

// jsonLeaf is a value in a JSON document that is not a non-empty mapping,
// with its dotted path.
type jsonLeaf struct {
	path  string
	value any
}

// jsonLeaves appends the leaves of v, under prefix, to out, in order.
func jsonLeaves(prefix string, v any, out []jsonLeaf) []jsonLeaf {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return append(out, jsonLeaf{path: prefix, value: v})
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		out = jsonLeaves(p, m[k], out)
	}
	return out
}

var unknownFieldError = regexp.MustCompile(`^unknown field "(.+)"$`)

// decodeStrict decodes data (and j, the same as JSON) into a T with the
// API that newAPI builds, and lists the leaves of the file.
func decodeStrict[T runtime.Object](newAPI func() (strictAPI, error), data, j []byte) (T, []jsonLeaf, error) {
	var zero T
	a, err := newAPI()
	if err != nil {
		return zero, nil, err
	}
	var tree map[string]any
	if err := json.Unmarshal(j, &tree); err != nil {
		return zero, nil, fmt.Errorf("read %s: %w", a.kind, err)
	}
	leaves := jsonLeaves("", tree, nil)
	obj, _, err := a.dec.Decode(data, nil, nil)
	if err != nil {
		return zero, nil, a.decodeError(err, leaves)
	}
	t, ok := obj.(T)
	if !ok {
		return zero, nil, fmt.Errorf("decoded a %T, not a %s", obj, a.kind)
	}
	return t, leaves, nil
}

// decodeError turns an error of the decoder into one that names
// the fields at fault: the unknown fields, then the values that do not
// decode (the decoder stops at the first of those, without a name when
// the value's own decoding fails).
func (a strictAPI) decodeError(err error, leaves []jsonLeaf) error {
	var valueErrs []error
	if _, ok := runtime.AsStrictDecodingError(err); !ok {
		var good []jsonLeaf
		valueErrs, good = a.valueErrors(leaves)
		if len(valueErrs) == 0 {
			return fmt.Errorf("decode %s: %w", a.kind, err)
		}
		// Decode the rest again for its unknown fields.
		rest, merr := json.Marshal(jsonDoc(good))
		if merr != nil {
			return joinErrors(valueErrs)
		}
		_, _, err = a.dec.Decode(rest, nil, nil)
	}
	var errs []error
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		for _, e := range strict.Errors() {
			errs = append(errs, a.describeUnknownField(e))
		}
	}
	return joinErrors(append(errs, valueErrs...))
}

// jsonDoc is the JSON document of leaves.
func jsonDoc(leaves []jsonLeaf) map[string]any {
	doc := map[string]any{}
	for _, l := range leaves {
		m := doc
		parts := strings.Split(l.path, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = l.value
	}
	return doc
}

// describeUnknownField adds the field that was probably meant to an
// unknown field error of the strict decoder.
func (a strictAPI) describeUnknownField(err error) error {
	match := unknownFieldError.FindStringSubmatch(err.Error())
	if match == nil {
		return err
	}
	if to, ok := a.moved[match[1]]; ok {
		return fmt.Errorf("unknown field %q (%s has it at %q)", match[1], a.kind, to)
	}
	parent, name, prefix := "", match[1], ""
	if i := strings.LastIndex(name, "."); i >= 0 {
		parent, name, prefix = name[:i], name[i+1:], name[:i+1]
	}
	t := a.typ
	if parent != "" {
		var ok bool
		if t, ok = jsonPathType(t, parent); !ok {
			return err
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return err
	}
	return unknownField(prefix, name, slices.Collect(maps.Keys(jsonFieldsOf(t))))
}

// valueErrors finds the leaves whose values do not decode, each
// alone, to name them; good are the others.
func (a strictAPI) valueErrors(leaves []jsonLeaf) (errs []error, good []jsonLeaf) {
	for _, l := range leaves {
		b, err := json.Marshal(jsonDoc([]jsonLeaf{l}))
		if err != nil {
			continue
		}
		if err = json.Unmarshal(b, reflect.New(a.typ).Interface()); err == nil {
			good = append(good, l)
			continue
		}
		t, ok := jsonPathType(a.typ, l.path)
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %w", l.path, err))
			continue
		}
		raw, _ := json.Marshal(l.value)
		te := (*json.UnmarshalTypeError)(nil)
		switch {
		case errors.As(err, &te) && jsonKind(raw) == "a number" && describeType(t) == "an integer":
			errs = append(errs, fmt.Errorf("%s: %s is not an integer that fits in %s", l.path, raw, t))
		case te != nil:
			errs = append(errs, fmt.Errorf("%s: want %s, got %s", l.path, describeType(t), jsonKind(raw)))
		default:
			errs = append(errs, fmt.Errorf("%s: %s is not %s", l.path, raw, describeType(t)))
		}
	}
	return errs, good
}

// jsonFieldsOf maps the json names of a struct's fields, with those of
// inlined structs, to their types.
func jsonFieldsOf(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			maps.Copy(out, jsonFieldsOf(f.Type))
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}

// jsonPathType is the type of the value at a dotted path ("ipvs.scheduler",
// "logging.vmodule[0]") in a value of type t.
func jsonPathType(t reflect.Type, path string) (reflect.Type, bool) {
	for _, seg := range strings.Split(path, ".") {
		name, _, indexed := strings.Cut(seg, "[")
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			ft, ok := jsonFieldsOf(t)[name]
			if !ok {
				return nil, false
			}
			t = ft
		case reflect.Map:
			t = t.Elem()
		default:
			return nil, false
		}
		if indexed {
			if t.Kind() != reflect.Slice {
				return nil, false
			}
			t = t.Elem()
		}
	}
	return t, true
}
