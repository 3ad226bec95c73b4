package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// UnmarshalStrict decodes YAML (or JSON) into v strictly: an unknown field is an error. Its
// errors are short and name the field with its indices, relative to v
// ("loadBalancer.services[0].persistence: ..."), and quote at most MaxQuoted bytes of a value.
//
// Configs of the usual shape take a faster way than the YAML library (fastJSON), with the
// same result; anything else, and every error, is the library's.
func UnmarshalStrict(b []byte, v any) error {
	if j, ok := fastJSON(b, reflect.TypeOf(v)); ok && decodeFresh(j, v) {
		return nil
	}
	err := yaml.UnmarshalStrict(b, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Errorf("%s: %s", fieldPath(b, v, te), typeErrorText(te))
	}
	if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
		key, uerr := strconv.Unquote(`"` + m[1] + `"`) // json quoted it with %q
		if uerr != nil {
			key = m[1]
		}
		return fmt.Errorf("unknown field %s", Quote(key))
	}
	return errors.New(shorten(plumbingCut(err.Error()), 4*MaxQuoted))
}

// plumbingPrefixes are what sigs.k8s.io/yaml and encoding/json put before a message
// ("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal ...").
var plumbingPrefixes = []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: "}

// plumbingCut drops the plumbing prefixes from the start of msg, and only there: a value in
// the message may hold the same words (transports: "json: x").
func plumbingCut(msg string) string {
	for cut := true; cut; {
		cut = false
		for _, p := range plumbingPrefixes {
			if rest, ok := strings.CutPrefix(msg, p); ok {
				msg, cut = rest, true
			}
		}
	}
	return msg
}

// decodeFresh decodes JSON strictly into v, a pointer, over what v holds (as the YAML library
// decodes: a caller's defaults stay where the input has no key), and reports whether it could;
// when not, v is left as it was. A v that is not zero is copied first, by JSON, so that a
// failed decode changes nothing of it; one that does not copy that way takes the library's.
func decodeFresh(j []byte, v any) bool {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false
	}
	fresh := reflect.New(rv.Elem().Type())
	if !rv.Elem().IsZero() {
		b, err := json.Marshal(v)
		if err != nil || json.Unmarshal(b, fresh.Interface()) != nil || !reflect.DeepEqual(fresh.Elem().Interface(), rv.Elem().Interface()) {
			return false
		}
	}
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	if d.Decode(fresh.Interface()) != nil {
		return false
	}
	rv.Elem().Set(fresh.Elem())
	return true
}

// shorten cuts a long decoding message to about max bytes. YAML lists its errors a line each
// ("  line 3: key \"t\" already set in map"): whole lines are kept and the last says how many
// were left off, so every line still names where it is. A message of one line (one that
// quotes the document itself) is cut and ends in "…".
func shorten(msg string, max int) string {
	if len(msg) <= max {
		return msg
	}
	lines := strings.Split(msg, "\n")
	n, size := 0, len(" (and 999 more)")
	for n < len(lines) && size+len(lines[n])+1 <= max {
		size += len(lines[n]) + 1
		n++
	}
	if n < 2 { // not even the heading and one error fit
		return strings.ToValidUTF8(msg[:max], "") + "…"
	}
	kept := strings.Join(lines[:n], "\n")
	if n < len(lines) {
		kept += fmt.Sprintf(" (and %d more)", len(lines)-n)
	}
	return kept
}

var unknownField = regexp.MustCompile(`unknown field "((?:[^"\\]|\\.)*)"`)

var durationType = reflect.TypeFor[Duration]()

// durationError is how Duration reports a bad value: an *json.UnmarshalTypeError is the one
// error to which encoding/json adds the field's path; UnmarshalStrict shows Value as the text.
func durationError(format string, a ...any) error {
	return &json.UnmarshalTypeError{Value: fmt.Sprintf(format, a...), Type: durationType}
}

// typeErrorText says what is wrong with the value, without the field.
func typeErrorText(te *json.UnmarshalTypeError) string {
	if te.Type == durationType {
		return te.Value
	}
	got := te.Value
	switch {
	case got == "array":
		got = "a list"
	case got == "object":
		got = "a mapping"
	case got == "string" || got == "number" || got == "bool":
		got = "a " + got
	default:
		got = Cut(got) // "number 1.5"
	}
	return fmt.Sprintf("want %s, got %s", kindName(te.Type), got)
}

func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

// fieldPath turns encoding/json's path of a type error ("loadBalancer.services.persistence",
// without indices) into one with them ("loadBalancer.services[1].persistence"): it walks the
// document along v's type and picks the first value at that path that does not decode as
// te.Type. It falls back to encoding/json's path.
func fieldPath(b []byte, v any, te *json.UnmarshalTypeError) string {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return te.Field
	}
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	var doc any
	if d.Decode(&doc) != nil {
		return te.Field
	}
	w := walker{te: te}
	if p, ok := w.walk(doc, reflect.TypeOf(v), strings.Split(te.Field, ".")); ok {
		return strings.TrimPrefix(p, ".")
	}
	return te.Field
}

type walker struct{ te *json.UnmarshalTypeError }

// walk looks for the bad value in node, whose Go type is t, at path.
func (w walker) walk(node any, t reflect.Type, path []string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if len(path) == 0 && (t == w.te.Type || t.Kind() != reflect.Slice && t.Kind() != reflect.Array && t.Kind() != reflect.Map) {
		return "", w.bad(node)
	}
	switch n := node.(type) {
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range n {
				if p, ok := w.walk(e, t.Elem(), path); ok {
					return fmt.Sprintf("[%d]", i) + p, true
				}
			}
			return "", false
		}
	case map[string]any:
		switch {
		case t.Kind() == reflect.Map: // encoding/json's path has no map keys
			for _, k := range slices.Sorted(maps.Keys(n)) {
				if p, ok := w.walk(n[k], t.Elem(), path); ok {
					return "." + k + p, true
				}
			}
			return "", false
		case t.Kind() == reflect.Struct && len(path) > 0:
			f, ok := jsonField(t, path[0])
			if !ok {
				break
			}
			for k, e := range n { // encoding/json matches keys case-insensitively
				if k == path[0] || strings.EqualFold(k, path[0]) {
					if p, ok := w.walk(e, f.Type, path[1:]); ok {
						return "." + path[0] + p, true
					}
				}
			}
			return "", false
		}
	}
	return "", len(path) == 0 && w.bad(node) // node is not what t wants: it is the bad value
}

// bad reports whether v does not decode as the error's type.
func (w walker) bad(v any) bool {
	if w.te.Type.Kind() == reflect.String {
		switch v.(type) {
		case string, json.Number, bool: // the YAML decoder turns these into strings
			return false
		}
	}
	raw, err := json.Marshal(v)
	return err == nil && json.Unmarshal(raw, reflect.New(w.te.Type).Interface()) != nil
}

// JSONName is the key encoding/json reads and writes struct field f as (ok false: none, an
// unexported field or json:"-").
func JSONName(f reflect.StructField) (string, bool) {
	tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if tag == "-" || !f.IsExported() {
		return "", false
	}
	if tag == "" {
		tag = f.Name
	}
	return tag, true
}

// jsonField finds the field of struct t that encoding/json decodes the key name into.
func jsonField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, ok := JSONName(f); ok && tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
