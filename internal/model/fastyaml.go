package model

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// fastJSON converts YAML of the shape configs are written in to JSON, without the YAML
// library: block mappings and sequences (indentless ones too), one-line flow collections,
// one-line plain and quoted scalars, comments, printable ASCII. Plain scalars are resolved as
// YAML 1.1 resolves them for sigs.k8s.io/yaml (yes/on are true, ~ is null, 80 is a number);
// what it is unsure of (floats, timestamps, octal, anchors, tags, block scalars, escapes,
// multi-line scalars, keys that differ only in case, duplicate keys, tabs) makes ok false, and
// the caller takes the YAML library's way. A config of 10,000 backends costs the library
// ~60 ms to turn into JSON; this, a few.
//
// On ok the JSON holds the values sigs.k8s.io/yaml's conversion gives for decoding into a
// value of type into (nil: YAMLToJSONStrict's): that library writes a number or a bool as a
// string where the field is a string, and so does this (FuzzFastJSON compares both ways). A
// caller whose JSON decoding of the output fails takes the library's way, for its errors.
func fastJSON(b []byte, into reflect.Type) (out []byte, ok bool) {
	p := fastParser{out: make([]byte, 0, len(b)+len(b)/4)}
	if !p.split(b) || len(p.lines) == 0 {
		return nil, false
	}
	if !p.block(0, targetOf(into)) || p.i != len(p.lines) {
		return nil, false
	}
	return p.out, true
}

type fastLine struct {
	indent int
	text   string // without the indentation; trailing spaces trimmed
}

type fastParser struct {
	lines []fastLine
	i     int
	out   []byte
	depth int // collections open
}

// enter counts a collection opened; configs nest a few deep, the library limits nesting.
func (p *fastParser) enter() bool {
	p.depth++
	return p.depth <= 32
}

// split cuts b into lines, leaving out blank and comment-only ones; anything but printable
// ASCII, spaces and newlines, and any directive or document marker, is refused.
func (p *fastParser) split(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\n') || c > '~' {
			return false
		}
	}
	s := string(b)
	p.lines = make([]fastLine, 0, strings.Count(s, "\n")+1)
	for line := range strings.SplitSeq(s, "\n") {
		indented := strings.TrimLeft(line, " ")
		text := strings.TrimRight(indented, " ")
		if text == "" || text[0] == '#' {
			continue
		}
		if text[0] == '%' || strings.HasPrefix(text, "---") || strings.HasPrefix(text, "...") {
			return false
		}
		p.lines = append(p.lines, fastLine{indent: len(line) - len(indented), text: text})
	}
	return true
}

// block writes the node that starts at the current line, whose indentation must be at least
// min: a mapping or a sequence.
func (p *fastParser) block(min int, t target) bool {
	l := p.lines[p.i]
	if l.indent < min {
		return false
	}
	if isSeqItem(l.text) {
		return p.seq(l.indent, t)
	}
	return p.mapping(l.indent, t)
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// mapping writes the block mapping whose keys are at indentation n.
func (p *fastParser) mapping(n int, t target) bool {
	if !p.enter() {
		return false
	}
	defer func() { p.depth-- }()
	p.out = append(p.out, '{')
	var keys fastKeys
	for first := true; p.i < len(p.lines); first = false {
		l := p.lines[p.i]
		if l.indent < n || l.indent == n && isSeqItem(l.text) { // a dash after a key's inline value ends the mapping: the caller refuses it
			break
		}
		if l.indent != n {
			return false
		}
		key, rest, ok := splitKey(l.text)
		if !ok || !keys.add(key) {
			return false
		}
		if !first {
			p.out = append(p.out, ',')
		}
		p.out = appendJSONString(p.out, key)
		p.out = append(p.out, ':')
		p.i++
		ft, ok := t.field(key)
		if !ok {
			return false
		}
		if !p.value(n, rest, true, ft) {
			return false
		}
	}
	p.out = append(p.out, '}')
	return true
}

// seq writes the block sequence whose dashes are at indentation n.
func (p *fastParser) seq(n int, t target) bool {
	et := t.elem()
	if !p.enter() {
		return false
	}
	defer func() { p.depth-- }()
	p.out = append(p.out, '[')
	for first := true; p.i < len(p.lines); first = false {
		l := p.lines[p.i]
		if l.indent < n || l.indent == n && !isSeqItem(l.text) {
			break
		}
		if l.indent != n {
			return false
		}
		if !first {
			p.out = append(p.out, ',')
		}
		item := strings.TrimLeft(strings.TrimPrefix(l.text, "-"), " ")
		switch {
		case item == "" || item[0] == '#':
			p.i++
			if !p.value(n, "", false, et) {
				return false
			}
		case isSeqItem(item):
			return false // "- - x": not a shape configs use
		default:
			if _, _, ok := splitKey(item); ok { // "- key: value": a mapping at the key's column
				p.lines[p.i] = fastLine{indent: n + len(l.text) - len(item), text: item}
				if !p.mapping(p.lines[p.i].indent, et) {
					return false
				}
				continue
			}
			p.i++
			if !p.value(n, item, false, et) {
				return false
			}
		}
	}
	p.out = append(p.out, ']')
	return true
}

// value writes the value of a key (ofKey) or a dash at indentation n whose own line left
// rest: the value itself, or nothing (then it is on the lines below, or null).
func (p *fastParser) value(n int, rest string, ofKey bool, t target) bool {
	if rest == "" || rest[0] == '#' {
		if p.i < len(p.lines) {
			l := p.lines[p.i]
			if l.indent > n {
				return p.block(n+1, t)
			}
			if ofKey && l.indent == n && isSeqItem(l.text) { // an indentless sequence
				return p.seq(n, t)
			}
		}
		p.out = append(p.out, "null"...)
		return true
	}
	tail, ok := p.inline(rest, false, t)
	if !ok || !isCommentOrEmpty(tail) {
		return false
	}
	// A value on the key's line ends there: a deeper line below would continue it.
	return p.i == len(p.lines) || p.lines[p.i].indent <= n
}

// isCommentOrEmpty: what follows a value on its line is nothing, or a comment after a space.
func isCommentOrEmpty(s string) bool {
	return s == "" || s[0] == ' ' && strings.TrimLeft(s, " ")[0] == '#'
}

// inline writes the scalar or flow collection at the start of s and returns what follows
// it. In flow (inside [] or {}) a plain scalar ends at , ] } as well.
func (p *fastParser) inline(s string, flow bool, t target) (string, bool) {
	switch s[0] {
	case '{':
		return p.flowMap(s[1:], t)
	case '[':
		return p.flowSeq(s[1:], t)
	case '"', '\'':
		v, rest, ok := quoted(s)
		if !ok {
			return "", false
		}
		p.out = appendJSONString(p.out, v)
		return rest, true
	}
	v, rest, ok := plain(s, flow)
	if !ok {
		return "", false
	}
	kind := resolvePlain(v)
	switch {
	case kind == plainUnsure || t.unsure && kind != plainString && kind != plainNull:
		return "", false
	case kind == plainString:
		p.out = appendJSONString(p.out, v)
	case kind == plainNull:
		p.out = append(p.out, "null"...)
	case t.str: // the library writes a number or a bool as a string where a string goes
		p.out = appendJSONString(p.out, [...]string{plainInt: v, plainTrue: "true", plainFalse: "false"}[kind])
	case kind == plainInt:
		p.out = append(p.out, v...)
	default:
		p.out = append(p.out, [...]string{plainTrue: "true", plainFalse: "false"}[kind]...)
	}
	return rest, true
}

// flow writes a flow collection: s is what follows its opening bracket open, item writes one
// item (an element, a key and its value); it returns what follows the closing bracket.
func (p *fastParser) flow(s string, open, close byte, item func(string) (string, bool)) (string, bool) {
	if !p.enter() {
		return "", false
	}
	defer func() { p.depth-- }()
	p.out = append(p.out, open)
	s = strings.TrimLeft(s, " ")
	if s != "" && s[0] == close {
		p.out = append(p.out, close)
		return s[1:], true
	}
	for {
		rest, ok := item(s)
		if !ok {
			return "", false
		}
		s = strings.TrimLeft(rest, " ")
		switch {
		case s != "" && s[0] == ',':
			p.out = append(p.out, ',')
			s = strings.TrimLeft(s[1:], " ")
			if s != "" && s[0] == close { // a trailing comma
				return "", false
			}
		case s != "" && s[0] == close:
			p.out = append(p.out, close)
			return s[1:], true
		default: // "[a: b]", a comment, the line's end
			return "", false
		}
	}
}

func (p *fastParser) flowSeq(s string, t target) (string, bool) {
	et := t.elem()
	return p.flow(s, '[', ']', func(s string) (string, bool) {
		if s == "" || s[0] == ',' || s[0] == ']' || s[0] == '#' {
			return "", false
		}
		return p.inline(s, true, et)
	})
}

func (p *fastParser) flowMap(s string, t target) (string, bool) {
	var keys fastKeys
	return p.flow(s, '{', '}', func(s string) (string, bool) {
		key, rest, ok := splitFlowKey(s)
		if !ok || !keys.add(key) {
			return "", false
		}
		p.out = appendJSONString(p.out, key)
		p.out = append(p.out, ':')
		s = strings.TrimLeft(rest, " ")
		if s == "" || s[0] == ',' || s[0] == '}' || s[0] == '#' {
			return "", false // "{a: }": null values are left to the library
		}
		ft, ok := t.field(key)
		if !ok {
			return "", false
		}
		return p.inline(s, true, ft)
	})
}

// fastKeys refuses a mapping's key that equals another but for case: YAML keeps both,
// sigs.k8s.io/yaml writes them sorted and encoding/json takes the last that matches a field,
// so which wins would depend on the order.
type fastKeys struct {
	n    int
	keys [32]string // lower case; configs' mappings are small, a bigger one is the library's
}

func (k *fastKeys) add(key string) bool {
	lower := strings.ToLower(key)
	for _, o := range k.keys[:k.n] {
		if o == lower {
			return false
		}
	}
	if k.n == len(k.keys) {
		return false
	}
	k.keys[k.n] = lower
	k.n++
	return true
}

// splitKey splits "key: rest" (or "key:" alone) of a block mapping. Plain keys are made of
// letters, digits and _ . / - and resolve to a string; quoted keys are any one-line string.
func splitKey(text string) (key, rest string, ok bool) {
	var after string
	if text[0] == '"' || text[0] == '\'' {
		if key, after, ok = quoted(text); !ok || len(key) > 200 { // YAML's implicit keys are short
			return "", "", false
		}
	} else {
		n := keyLen(text)
		if n == 0 {
			return "", "", false
		}
		key, after = text[:n], text[n:]
		if resolvePlain(key) != plainString {
			return "", "", false
		}
	}
	if after == ":" {
		return key, "", true
	}
	if !strings.HasPrefix(after, ": ") {
		return "", "", false
	}
	return key, strings.TrimLeft(after[2:], " "), true
}

// splitFlowKey splits "key: rest" inside {}.
func splitFlowKey(s string) (key, rest string, ok bool) {
	if s == "" {
		return "", "", false
	}
	key, rest, ok = splitKey(s)
	if !ok || rest == "" {
		return "", "", false
	}
	return key, rest, true
}

func keyLen(s string) int {
	n := 0
	for n < len(s) && n < 256 {
		c := s[n]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-') {
			break
		}
		n++
	}
	if n == 256 || n > 0 && s[0] == '-' {
		return 0
	}
	return n
}

// quoted reads the one-line quoted scalar at the start of s: single-quoted (a quote doubled is one quote)
// or double-quoted without escapes.
func quoted(s string) (v, rest string, ok bool) {
	q := s[0]
	if q == '"' {
		end := strings.IndexByte(s[1:], '"')
		if end < 0 || strings.IndexByte(s[1:1+end], '\\') >= 0 {
			return "", "", false
		}
		return s[1 : 1+end], s[2+end:], true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '\'' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		return b.String(), s[i+1:], true
	}
	return "", "", false
}

// plain reads the plain scalar at the start of s. In a block it runs to the line's end or a
// comment and may not hold ": "; in flow it also ends at , ] }. Scalars that begin with an
// indicator, or that YAML could read otherwise, are refused.
func plain(s string, flow bool) (v, rest string, ok bool) {
	c := s[0]
	if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '/' || c == '_' || c == '+' || c == '~' ||
		c == '-' && len(s) > 1 && s[1] != ' ') {
		return "", "", false
	}
	i := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case ':':
			if i+1 == len(s) || s[i+1] == ' ' {
				return "", "", false // a key where a value was expected, or "a: b: c"
			}
			if flow && strings.IndexByte(",[]{}", s[i+1]) >= 0 {
				return "", "", false
			}
		case '#':
			if s[i-1] == ' ' {
				if flow {
					return "", "", false
				}
				v = strings.TrimRight(s[:i], " ")
				return v, s[len(v):], true
			}
		case ',', ']', '}', '[', '{', '?':
			if flow {
				if s[i] == '[' || s[i] == '{' || s[i] == '?' { // "[0?]": the library ends a scalar at '?' too
					return "", "", false
				}
				return strings.TrimRight(s[:i], " "), s[i:], true
			}
		}
	}
	return strings.TrimRight(s, " "), "", true
}

type plainKind int

const (
	plainUnsure plainKind = iota
	plainString
	plainInt
	plainNull
	plainTrue
	plainFalse
)

// resolvePlain says what YAML 1.1 (go-yaml v2, which sigs.k8s.io/yaml uses) reads a plain
// scalar as, where that is certain: a string, a decimal integer (written as JSON writes it),
// null, true or false. Floats, timestamps and integers in other forms are plainUnsure.
func resolvePlain(s string) plainKind {
	switch s {
	case "~", "null", "Null", "NULL":
		return plainNull
	case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
		return plainTrue
	case "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
		return plainFalse
	case "<<", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF":
		return plainUnsure
	}
	c := s[0]
	switch {
	case c == '.':
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			return plainUnsure
		}
		return plainString
	case c >= '0' && c <= '9' || c == '+' || c == '-':
		if decimalInt(s) {
			return plainInt
		}
		if len(s) > 4 && s[4] == '-' && allDigits(s[:4]) { // a timestamp, maybe
			return plainUnsure
		}
		if !numberChars(s) || strings.Count(s, ".") > 1 { // an address, a prefix: no number has these
			return plainString
		}
		n := strings.ReplaceAll(s, "_", "")
		if _, err := strconv.ParseInt(n, 0, 64); err == nil {
			return plainUnsure
		}
		if _, err := strconv.ParseUint(n, 0, 64); err == nil {
			return plainUnsure
		}
		if _, err := strconv.ParseFloat(n, 64); err == nil {
			return plainUnsure
		}
		if strings.HasPrefix(strings.TrimLeft(n, "+-"), "0b") {
			return plainUnsure
		}
	}
	return plainString
}

// decimalInt: an integer as JSON writes it (no sign but -, no leading zero, not -0) that
// fits an int64.
func decimalInt(s string) bool {
	d := strings.TrimPrefix(s, "-")
	if d == "" || len(d) > 18 || !allDigits(d) {
		return false
	}
	return d == "0" && d == s || d[0] != '0'
}

// numberChars: s has only characters that Go's number parsing and YAML's numbers use.
func numberChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '.' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// appendJSONString appends s (printable ASCII) as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// A target is the Go type a node decodes into, as far as sigs.k8s.io/yaml looks at it: it
// writes a number or a bool as a string where the type is a string (a port number as a
// name, YAML 1.1's bare `off` as "false"), and not where the type decodes itself.
type target struct {
	t      reflect.Type // nil: unknown, or nothing that changes how a scalar is written
	str    bool         // a string: numbers and bools are written as strings
	unsure bool         // a string that decodes itself: whether the library converts depends on where it is
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func targetOf(t reflect.Type) target {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return target{}
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(jsonUnmarshaler) || pt.Implements(textUnmarshaler) {
		return target{unsure: t.Kind() == reflect.String}
	}
	return target{t: t, str: t.Kind() == reflect.String}
}

// elem is the target of a sequence's items or a mapping's values.
func (x target) elem() target {
	if x.t != nil && (x.t.Kind() == reflect.Slice || x.t.Kind() == reflect.Map) {
		return targetOf(x.t.Elem())
	}
	return target{}
}

// field is the target of key's value; ok is false for a struct with embedded fields, whose
// lookup this does not follow.
func (x target) field(key string) (target, bool) {
	if x.t == nil {
		return target{}, true
	}
	switch x.t.Kind() {
	case reflect.Map:
		return x.elem(), true
	case reflect.Struct:
	default:
		return target{}, true
	}
	fields, ok := jsonFields(x.t)
	if !ok {
		return target{}, false
	}
	var folded *structField // the library takes the exact name, else the first that matches regardless of case
	for i, f := range fields {
		if f.name == key {
			return targetOf(f.t), true
		}
		if folded == nil && strings.EqualFold(f.name, key) {
			folded = &fields[i]
		}
	}
	if folded != nil {
		return targetOf(folded.t), true
	}
	return target{}, true
}

type structField struct {
	name string
	t    reflect.Type
}

var fieldCache sync.Map // reflect.Type -> []structField, nil for a struct with embedded fields

// jsonFields lists a struct's fields by their JSON names, in order.
func jsonFields(t reflect.Type) ([]structField, bool) {
	if f, ok := fieldCache.Load(t); ok {
		l := f.([]structField)
		return l, l != nil
	}
	l := []structField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			l = nil
			break
		}
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && !strings.HasPrefix(f.Tag.Get("json"), "-,") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		l = append(l, structField{name, f.Type})
	}
	fieldCache.Store(t, l)
	return l, l != nil
}
