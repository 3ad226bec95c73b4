package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/nftlist"
)

// TableRef names one table.
type TableRef struct {
	Family knftables.Family
	Name   string
}

func (t TableRef) String() string { return string(t.Family) + " " + t.Name }

// ours reports whether a table belongs to the load balancer.
func (t TableRef) ours() bool {
	return t.Family == knftables.InetFamily && t.Name == NATTable ||
		t.Family == knftables.NetDevFamily && strings.HasPrefix(t.Name, IngressTablePrefix)
}

// ListTables lists the tables of the calling thread's network namespace over netlink: Apply
// asks at every sync which of our tables exist (internal/nftlist).
func ListTables(ctx context.Context) ([]TableRef, error) {
	ts, err := nftlist.Tables(ctx)
	refs := make([]TableRef, 0, len(ts))
	for _, t := range ts {
		refs = append(refs, TableRef(t))
	}
	return refs, err
}

// Lister runs `nft --json ARGS...` and returns its output (injectable for tests).
type Lister func(ctx context.Context, args ...string) ([]byte, error)

// NFTList is the real Lister. A reading nothing waits for (background) runs nft at the
// lowest CPU priority.
func NFTList(ctx context.Context, args ...string) ([]byte, error) {
	return runNft(ctx, "", append([]string{"--json"}, args...)...)
}

// runNft runs nft with args (and stdin, if any) from the calling thread, in its network
// namespace; at the lowest CPU priority when nothing waits for it (background).
func runNft(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Start()
	if err == nil {
		if ctx.Value(backgroundKey{}) != nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, 19) // best effort: it may have exited
		}
		err = cmd.Wait()
	}
	if err != nil {
		return nil, fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

type backgroundKey struct{}

// background marks ctx as a reading nothing waits for (the periodic full read, Settle): nft
// lists the whole ruleset for it, seconds of CPU at 5,000 services, and at nice 19 it leaves
// the CPU to the syncs of changes that run beside it on a small node.
func background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// kernelTable is one of our tables as the kernel has it (or as our last apply left it).
type kernelTable struct {
	*nftjson.Table                       // comment (from the layout set), chains with rules
	Maps           map[string]*kernelMap // sets and maps
	Counters       map[string]Counter    // named counters
}

// Counter is a named counter's value.
type Counter struct {
	Comment string `json:"comment"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

type kernelMap struct {
	IsSet   bool
	Dynamic bool
	Comment string
	Elems   map[string]string // canonical key -> canonical data ("" in sets)
}

// layoutSet is an empty set in each table whose comment is the table's comment: nft 1.0.6
// leaves table comments out of its JSON.
const layoutSet = "layout"

// observe reads one of our tables whole (terse: without elements).
func (m *Manager) observe(ctx context.Context, ref TableRef, terse bool) (*kernelTable, error) {
	args := []string{"list", "table", string(ref.Family), ref.Name}
	if terse {
		args = append([]string{"--terse"}, args...)
	}
	out, err := m.List(ctx, args...)
	if err != nil {
		return nil, err
	}
	return parseTable(ref, out)
}

// parseTable reads `nft --json list ...` output (one or more documents) about one table.
func parseTable(ref TableRef, out []byte) (*kernelTable, error) {
	objs, err := decodeDocs(out)
	if err != nil {
		return nil, err
	}
	// Rules' expressions and map values are kept as JSON text, compact (as the agent's known
	// rules and rendered elements have them; nft 1.0.6 writes ", " and ": ").
	var b bytes.Buffer
	for _, o := range objs {
		for kind, raw := range o {
			if bytes.IndexByte(raw, ' ') < 0 && bytes.IndexByte(raw, '\n') < 0 {
				continue
			}
			b.Reset()
			if err := json.Compact(&b, raw); err != nil {
				return nil, fmt.Errorf("parse nft json %s: %w", kind, err)
			}
			o[kind] = bytes.Clone(b.Bytes())
		}
	}
	tab, err := nftjson.ParseObjects(objs)
	if err != nil {
		return nil, err
	}
	kt := &kernelTable{Table: tab, Maps: map[string]*kernelMap{}, Counters: map[string]Counter{}}
	for _, o := range objs {
		for kind, raw := range o {
			if kind == "counter" {
				var c struct {
					Name string `json:"name"`
					Counter
				}
				if err := json.Unmarshal(raw, &c); err != nil {
					return nil, fmt.Errorf("parse nft json counter: %w", err)
				}
				kt.Counters[c.Name] = c.Counter
				continue
			}
			if kind != "set" && kind != "map" {
				continue
			}
			var mp struct {
				Name    string            `json:"name"`
				Comment string            `json:"comment"`
				Type    json.RawMessage   `json:"type"`
				Map     json.RawMessage   `json:"map"`
				Flags   json.RawMessage   `json:"flags"`
				Elem    []json.RawMessage `json:"elem"`
			}
			if err := json.Unmarshal(raw, &mp); err != nil {
				return nil, fmt.Errorf("parse nft json %s: %w", kind, err)
			}
			km := &kernelMap{IsSet: kind == "set", Comment: mp.Comment, Elems: map[string]string{},
				Dynamic: bytes.Contains(mp.Flags, []byte(`"timeout"`)) || bytes.Contains(mp.Flags, []byte(`"dynamic"`))}
			keyTypes, valueTypes := elemTypes(mp.Type), elemTypes(mp.Map)
			for _, e := range mp.Elem {
				if kind == "set" {
					km.Elems[canonical(e, keyTypes)] = ""
					continue
				}
				var pair []json.RawMessage
				if err := json.Unmarshal(e, &pair); err != nil || len(pair) != 2 {
					return nil, fmt.Errorf("parse nft json: map %s element %s", mp.Name, e)
				}
				km.Elems[canonical(pair[0], keyTypes)] = canonical(pair[1], valueTypes)
			}
			kt.Maps[mp.Name] = km
		}
	}
	kt.Table.Family, kt.Table.Name = string(ref.Family), ref.Name
	if l := kt.Maps[layoutSet]; l != nil {
		kt.Table.Comment = l.Comment
	}
	return kt, nil
}

// decodeDocs reads the objects of one or more concatenated `nft --json` documents.
func decodeDocs(out []byte) ([]map[string]json.RawMessage, error) {
	var objs []map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(out))
	for d.More() {
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := d.Decode(&doc); err != nil {
			return nil, fmt.Errorf("parse nft json: %w", err)
		}
		objs = append(objs, doc.Nftables...)
	}
	return objs, nil
}

// known is the table as an apply of t leaves it: what the next apply diffs against when it
// does not read the kernel. Dynamic maps are empty: their entries are the datapath's.
func known(t *Table) *kernelTable {
	kt := &kernelTable{Table: &nftjson.Table{Family: string(t.Family), Name: t.Name, Comment: t.Comment, Chains: map[string]*nftjson.Chain{}},
		Maps: map[string]*kernelMap{}, Counters: map[string]Counter{}}
	for _, c := range t.Counters {
		kt.Counters[c.Name] = Counter{Comment: *c.Comment}
	}
	for _, c := range t.Chains {
		kt.Chains[c.Name] = &nftjson.Chain{Rules: []*nftjson.Rule{}}
	}
	for _, r := range t.Rules {
		kt.Chains[r.Chain].Rules = append(kt.Chains[r.Chain].Rules, &nftjson.Rule{Comment: *r.Comment})
	}
	n := make(map[string]int, len(t.Sets)+len(t.Maps)) // elements per map: each map sized once
	for _, e := range t.Elements {
		n[e.Set+e.Map]++
	}
	for _, s := range t.Sets {
		kt.Maps[s.Name] = &kernelMap{IsSet: true, Comment: *s.Comment, Elems: make(map[string]string, n[s.Name])}
	}
	for _, mp := range t.Maps {
		_, dyn := t.Dynamic[mp.Name]
		kt.Maps[mp.Name] = &kernelMap{Dynamic: dyn, Comment: *mp.Comment, Elems: make(map[string]string, n[mp.Name])}
	}
	for _, e := range t.Elements {
		kt.Maps[e.Set+e.Map].Elems[elemKey(e)] = elemValue(e)
	}
	return kt
}

// elemTypes are the datatypes of a set's or map's keys (its "type") or a map's values (its
// "map"), one per part of a concatenation: nft lists a name, an array of names, or (1.0.6,
// values) the names joined by " . ".
func elemTypes(raw json.RawMessage) []string {
	var types []string
	if json.Unmarshal(raw, &types) == nil {
		return types
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return strings.Split(s, " . ")
	}
	return nil
}

// protoNames are the protocols' names by number, as Render writes them (laneProtos turned
// around).
var protoNames = func() map[int64]string {
	m := make(map[int64]string, len(laneProtos))
	for name, n := range laneProtos {
		m[int64(n)] = name
	}
	return m
}()

// canonical writes a JSON element or value as nft's text syntax does, the way Render writes
// them: "10.0.0.1 . tcp . 80", "goto svc-web-v4", "17829743", "02:00:00:00:00:01". types are
// its datatypes (elemTypes), one per part of a concatenation: without /etc/protocols (a slim
// container image) nft lists an inet_proto as its number, 6 for tcp. An IPv6 address is
// written as netip does (nft lists those in ::/96 as ::10.0.0.1, netip ::a00:1).
func canonical(raw json.RawMessage, types []string) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.IndexByte(s, ':') >= 0 {
			if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
				return a.String()
			}
		}
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			if name, ok := protoNames[i]; ok && len(types) == 1 && types[0] == "inet_proto" {
				return name
			}
			return strconv.FormatInt(i, 10)
		}
		return string(n)
	}
	var obj struct {
		Concat []json.RawMessage `json:"concat"`
		Elem   *struct {
			Val json.RawMessage `json:"val"`
		} `json:"elem"`
		Goto *struct{ Target string } `json:"goto"`
		Jump *struct{ Target string } `json:"jump"`
	}
	if json.Unmarshal(raw, &obj) != nil {
		return string(raw)
	}
	switch {
	case obj.Concat != nil:
		parts := make([]string, len(obj.Concat))
		for i, c := range obj.Concat {
			var t []string
			if len(types) == len(obj.Concat) {
				t = types[i : i+1]
			}
			parts[i] = canonical(c, t)
		}
		return strings.Join(parts, " . ")
	case obj.Elem != nil:
		return canonical(obj.Elem.Val, types)
	case obj.Goto != nil:
		return "goto " + obj.Goto.Target
	case obj.Jump != nil:
		return "jump " + obj.Jump.Target
	}
	return string(raw)
}

func elemKey(e *knftables.Element) string   { return strings.Join(e.Key, " . ") }
func elemValue(e *knftables.Element) string { return strings.Join(e.Value, " . ") }
