// Package nftjson reads one nftables table as the kernel has it (`nft --json list table`):
// what knftables' List* calls leave out (table comments, flowtable devices, rule counters),
// for status, metrics and drift detection.
package nftjson

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// ErrNoTable is returned by List when the table does not exist.
var ErrNoTable = errors.New("table does not exist")

// Lister runs `nft --json list table FAMILY NAME` (injectable for tests).
type Lister func(ctx context.Context, family, table string) ([]byte, error)

// NFT is the real Lister.
func NFT(ctx context.Context, family, table string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", "--json", "list", "table", family, table)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "No such file or directory") {
			return nil, ErrNoTable
		}
		return nil, fmt.Errorf("nft list table %s %s: %v: %s", family, table, err, strings.TrimSpace(stderr.String()))
	}
	// nft 1.0.6 leaves table comments out of its JSON; read it from the text listing. A
	// listing without it would be another table (its spec, which the comment holds, changed:
	// a rebuild that flushes every offloaded flow), so a failure is one.
	var terr bytes.Buffer
	cmd = exec.CommandContext(ctx, "nft", "--terse", "list", "table", family, table)
	cmd.Stderr = &terr
	text, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft --terse list table %s %s: %v: %s", family, table, err, strings.TrimSpace(terr.String()))
	}
	return withTableComment(out, text)
}

// textTableComment finds the table's comment in a text listing: among the lines that open
// the table (flags come before it).
var textTableComment = regexp.MustCompile(`^table \S+ \S+ \{\n(?:\s*flags [^\n]*\n)?\s*comment "((?:[^"\\]|\\.)*)"`)

// withTableComment puts the table comment from a text listing into JSON output that lacks it.
// Only the table's object is written again: the others stay as nft wrote them (decoded and
// written again, their keys sorted and numbers made floats, the same rules fingerprinted
// apart from a listing that had the comment).
func withTableComment(js, text []byte) ([]byte, error) {
	m := textTableComment.FindSubmatch(text)
	if m == nil {
		return js, nil
	}
	var doc map[string][]map[string]json.RawMessage
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, fmt.Errorf("parse nft json: %w", err)
	}
	for _, o := range doc["nftables"] {
		raw, ok := o["table"]
		if !ok {
			continue
		}
		var t map[string]json.RawMessage
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("parse nft json table: %w", err)
		}
		if _, has := t["comment"]; has {
			continue
		}
		c, err := marshal(string(m[1]))
		if err != nil {
			return nil, err
		}
		t["comment"] = c
		if o["table"], err = marshal(t); err != nil {
			return nil, err
		}
	}
	return marshal(doc)
}

// marshal is json.Marshal without its HTML escapes: a rule's `ct packets > 10` stays as nft
// wrote it ("\u003e" fingerprinted apart from the same rule listed without the comment).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Table is one table's contents.
type Table struct {
	Family     string                `json:"family"`
	Name       string                `json:"name"`
	Comment    string                `json:"comment,omitempty"`
	Flags      []string              `json:"flags,omitempty"` // dormant, owner, persist
	Flowtables map[string]*Flowtable `json:"flowtables,omitempty"`
	Sets       map[string]*Set       `json:"sets,omitempty"`
	Chains     map[string]*Chain     `json:"chains,omitempty"`
}

type Flowtable struct {
	Devices []string `json:"devices"`
	Flags   []string `json:"flags,omitempty"`
}

type Set struct {
	Type     string   `json:"type"`
	Flags    []string `json:"flags,omitempty"`
	Elements []string `json:"elements"`
}

type Chain struct {
	Type    string   `json:"type,omitempty"`
	Hook    string   `json:"hook,omitempty"`
	Prio    int      `json:"prio,omitempty"`
	Policy  string   `json:"policy,omitempty"`
	Devices []string `json:"devices,omitempty"`
	Rules   []*Rule  `json:"rules"`
}

// Rule is one rule; Expr is its JSON with counter values zeroed, so that it identifies
// the rule's meaning independent of traffic.
type Rule struct {
	Handle  int    `json:"handle"`
	Comment string `json:"comment,omitempty"`
	Expr    string `json:"-"`
	Counter bool   `json:"counter"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

type jsonRule struct {
	Chain   string            `json:"chain"`
	Handle  int               `json:"handle"`
	Comment string            `json:"comment"`
	Expr    []json.RawMessage `json:"expr"`
}

// List reads a table; ErrNoTable if it is absent.
func List(ctx context.Context, l Lister, family, table string) (*Table, error) {
	out, err := l(ctx, family, table)
	if err != nil {
		return nil, err
	}
	return Parse(out)
}

// Parse decodes `nft --json list table` output.
func Parse(out []byte) (*Table, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parse nft json: %w", err)
	}
	return ParseObjects(doc.Nftables)
}

// ParseObjects is Parse of the objects of the output's "nftables" list, decoded already (a
// caller that reads them itself need not write them out again for Parse).
func ParseObjects(objs []map[string]json.RawMessage) (*Table, error) {
	t := &Table{Flowtables: map[string]*Flowtable{}, Sets: map[string]*Set{}, Chains: map[string]*Chain{}}
	var rules []jsonRule
	for _, obj := range objs {
		for kind, raw := range obj {
			var err error
			switch kind {
			case "table":
				// Only these: the other fields of Table are ours, not nft's (a listing that
				// had them, e.g. "sets": null, would otherwise replace the maps).
				var tt struct {
					Family, Name, Comment string
					Flags                 json.RawMessage
				}
				if err = json.Unmarshal(raw, &tt); err == nil {
					t.Family, t.Name, t.Comment, t.Flags = tt.Family, tt.Name, tt.Comment, stringOrList(tt.Flags)
				}
			case "flowtable":
				var f struct {
					Name  string          `json:"name"`
					Dev   json.RawMessage `json:"dev"`
					Flags json.RawMessage `json:"flags"`
				}
				if err = json.Unmarshal(raw, &f); err == nil {
					t.Flowtables[f.Name] = &Flowtable{Devices: stringOrList(f.Dev), Flags: stringOrList(f.Flags)}
				}
			case "set":
				var s struct {
					Name  string            `json:"name"`
					Type  json.RawMessage   `json:"type"`
					Flags json.RawMessage   `json:"flags"`
					Elem  []json.RawMessage `json:"elem"`
				}
				if err = json.Unmarshal(raw, &s); err == nil {
					set := &Set{Type: strings.Join(stringOrList(s.Type), " . "), Flags: stringOrList(s.Flags), Elements: []string{}}
					for _, e := range s.Elem {
						set.Elements = append(set.Elements, element(e))
					}
					sort.Strings(set.Elements)
					t.Sets[s.Name] = set
				}
			case "chain":
				var c struct {
					Name   string          `json:"name"`
					Type   string          `json:"type"`
					Hook   string          `json:"hook"`
					Prio   int             `json:"prio"`
					Policy string          `json:"policy"`
					Dev    json.RawMessage `json:"dev"`
				}
				if err = json.Unmarshal(raw, &c); err == nil {
					t.Chains[c.Name] = &Chain{Type: c.Type, Hook: c.Hook, Prio: c.Prio, Policy: c.Policy, Devices: stringOrList(c.Dev), Rules: []*Rule{}}
				}
			case "rule":
				var r jsonRule
				if err = json.Unmarshal(raw, &r); err == nil {
					rules = append(rules, r)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("parse nft json %s: %w", kind, err)
			}
		}
	}
	for _, r := range rules {
		c := t.Chains[r.Chain]
		if c == nil {
			c = &Chain{}
			t.Chains[r.Chain] = c
		}
		rule := &Rule{Handle: r.Handle, Comment: r.Comment}
		var exprs []string
		for _, e := range r.Expr {
			var ctr struct {
				Counter *struct{ Packets, Bytes uint64 } `json:"counter"`
			}
			if json.Unmarshal(e, &ctr) == nil && ctr.Counter != nil {
				rule.Counter = true
				rule.Packets += ctr.Counter.Packets
				rule.Bytes += ctr.Counter.Bytes
				exprs = append(exprs, `{"counter":{}}`)
				continue
			}
			// compact: the same rule is the same string however the listing was spaced
			// (withTableComment writes the objects again, compacted)
			var c bytes.Buffer
			if json.Compact(&c, e) != nil {
				c.Reset()
				c.Write(e)
			}
			exprs = append(exprs, c.String())
		}
		rule.Expr = strings.Join(exprs, ",")
		c.Rules = append(c.Rules, rule)
	}
	return t, nil
}

// Fingerprint identifies the table's structure and contents, without counter values and
// handles: equal fingerprints mean nobody changed the table. (A base chain's policy and the
// table's flags count: a forward chain whose policy became drop, or a table made dormant,
// stops forwarding with every rule as it was.)
func (t *Table) Fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "table %s %s %q %v\n", t.Family, t.Name, t.Comment, t.Flags)
	for _, n := range sortedKeys(t.Flowtables) {
		fmt.Fprintf(h, "flowtable %s %v %v\n", n, t.Flowtables[n].Devices, t.Flowtables[n].Flags)
	}
	for _, n := range sortedKeys(t.Sets) {
		s := t.Sets[n]
		fmt.Fprintf(h, "set %s %s %v %v\n", n, s.Type, s.Flags, s.Elements)
	}
	for _, n := range sortedKeys(t.Chains) {
		c := t.Chains[n]
		fmt.Fprintf(h, "chain %s %s %s %d %s %v\n", n, c.Type, c.Hook, c.Prio, c.Policy, c.Devices)
		for _, r := range c.Rules {
			fmt.Fprintf(h, "rule %q %s\n", r.Comment, r.Expr)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func stringOrList(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}
	}
	var l []string
	_ = json.Unmarshal(raw, &l)
	sort.Strings(l)
	return l
}

// element renders one set element as nft's text syntax would ("10.0.0.0/8", "1.2.3.4",
// "1.2.3.4-1.2.3.9", "eth0"); host prefixes (/32, /128) come back as plain addresses.
func element(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number // as written: a float printed 3000000 as 3e+06
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	var obj struct {
		Prefix *struct {
			Addr string `json:"addr"`
			Len  int    `json:"len"`
		} `json:"prefix"`
		Range  []json.RawMessage              `json:"range"`
		Elem   *struct{ Val json.RawMessage } `json:"elem"`
		Concat []json.RawMessage              `json:"concat"`
	}
	if json.Unmarshal(raw, &obj) != nil {
		return string(raw)
	}
	switch {
	case obj.Prefix != nil:
		return fmt.Sprintf("%s/%d", obj.Prefix.Addr, obj.Prefix.Len)
	case len(obj.Range) == 2:
		return element(obj.Range[0]) + "-" + element(obj.Range[1])
	case obj.Elem != nil:
		return element(obj.Elem.Val)
	case obj.Concat != nil:
		parts := make([]string, len(obj.Concat))
		for i, c := range obj.Concat {
			parts[i] = element(c)
		}
		return strings.Join(parts, " . ")
	}
	return string(raw)
}
