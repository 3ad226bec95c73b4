package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Report is the outcome of one `hostaccel bench`: one Run per kernel it measured in.
type Report struct {
	Command  string    `json:"command"`
	Commit   string    `json:"commit,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Runs     []*Run    `json:"runs"`
	Notes    []string  `json:"notes,omitempty"`
	// Target is the per-packet goal: hostaccel at this fraction of the direct link or more.
	Target float64 `json:"target"`
}

// PerPacketTarget is the project's goal for hostaccel's per-packet cost: at least this
// fraction of a direct link's packets per second.
const PerPacketTarget = 0.90

// JSON encodes the report with every sample.
func (rep *Report) JSON() ([]byte, error) { return json.MarshalIndent(rep, "", "  ") }

// title returns the row title of a variant.
func title(r *Run, name string) string {
	for _, v := range r.Variants {
		if v.Name == name {
			return v.Title
		}
	}
	return name
}

func ran(r *Run) []VariantInfo {
	var out []VariantInfo
	for _, v := range r.Variants {
		if v.Ran {
			out = append(out, v)
		}
	}
	return out
}

// fmtValue prints a value like the seeds do (two decimals).
func fmtValue(x float64) string { return fmt.Sprintf("%.2f", x) }

func fmtPct(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return fmt.Sprintf("%+.0f%%", 100*x)
}

// Markdown renders the seed-style tables, the per-packet table, the path evidence, the
// machines and the method.
func (rep *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	date := rep.Started.Format("2006-01-02")
	w("# hostaccel bench, %s%s", date, map[bool]string{true: " (" + rep.Commit + ")", false: ""}[rep.Commit != ""])
	w("")
	w("Made with:")
	w("")
	w("    %s", rep.Command)
	w("")
	w("Wall time %s. Medians of every cell's repetitions; `±x%%` is the spread (every sample lies within x%% of the median), `(+y%%)` the change against Default in the same kernel and traffic type, **bold** the best per column and traffic type. Cells measured in the VM are compared only with the VM's own Default and direct link, never with the host's.",
		rep.Finished.Sub(rep.Started).Round(time.Second))
	w("")
	for _, line := range rep.summaryLines() {
		w("- %s", line)
	}
	w("")
	for _, r := range rep.Runs {
		if len(r.PktgenCells) > 0 {
			rep.pktgenSection(&b, r)
		}
	}
	for _, r := range rep.Runs {
		if len(r.Cells) > 0 {
			netperfSection(&b, r)
		}
	}
	for _, r := range rep.Runs {
		if len(r.Cells) > 0 {
			pathSection(&b, r)
		}
	}
	rep.machineSection(&b)
	rep.methodSection(&b)
	rulesetSection(&b, rep.Runs)
	return b.String()
}

// summaryLines are the headline: per-packet ratios and where each variant ran.
func (rep *Report) summaryLines() []string {
	var out []string
	for _, r := range rep.Runs {
		if len(r.PktgenCells) == 0 {
			continue
		}
		var dirs []string
		for _, d := range r.PktgenDirections() {
			var parts []string
			for _, c := range r.PktgenCells {
				if c.Direction.norm() != d || c.Variant == VariantDirect || c.VsDirect < 0 {
					continue
				}
				parts = append(parts, fmt.Sprintf("%s %.2f", title(r, c.Variant), c.VsDirect))
			}
			dirs = append(dirs, d.Title()+": "+strings.Join(parts, ", "))
		}
		out = append(out, fmt.Sprintf("Per packet (%s), share of the direct link's packets/s: %s. Target for hostaccel: %.2f.", r.Label, strings.Join(dirs, "; "), rep.Target))
	}
	for _, r := range rep.Runs {
		var skipped []string
		for _, v := range r.Variants {
			if !v.Ran {
				skipped = append(skipped, v.Title)
			}
		}
		line := fmt.Sprintf("%s: ran %s.", r.Label, joinTitles(ran(r)))
		if len(skipped) > 0 {
			line += fmt.Sprintf(" Not here (kernel lacks what they need): %s.", strings.Join(skipped, ", "))
		}
		out = append(out, line)
	}
	out = append(out, rep.Notes...)
	return out
}

func joinTitles(vs []VariantInfo) string {
	var s []string
	for _, v := range vs {
		s = append(s, v.Title)
	}
	return strings.Join(s, ", ")
}

func (rep *Report) pktgenSection(b *strings.Builder, r *Run) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	dirs := r.PktgenDirections()
	w("## Per-packet forwarding cost: pktgen, %s", r.Label)
	w("")
	w("%d-byte UDP packets of one flow from pktgen, through one node to a receiver that counts and drops them at its ingress: %s. The direct link sends over one veth instead, in the same direction. Packets/s at the receiver, in the kernel's clock; %d rounds per variant and direction, interleaved; a round where packets sent != packets received is discarded. The flow is made ESTABLISHED (one packet back on the reverse tuple) and warmed up before each round, so that UDP is offloaded where a ruleset offloads it.", r.PktgenSize, directionsText(dirs), r.Reps)
	w("")
	head, sep := "| Variant |", "| --- |"
	for _, d := range dirs {
		head += fmt.Sprintf(" %s: packets/s | vs direct link | vs Default |", d.Title())
		sep += " --- | --- | --- |"
	}
	w("%s slow-path packets per round | rounds kept (discarded) |", head)
	w("%s --- | --- |", sep)
	best := map[Direction]float64{}
	for _, c := range r.PktgenCells {
		if c.Variant != VariantDirect && c.Variant != VariantFloor && c.Stats.N > 0 {
			best[c.Direction.norm()] = math.Max(best[c.Direction.norm()], c.Stats.Median)
		}
	}
	ratio := func(x float64) string {
		if x < 0 {
			return ""
		}
		return fmt.Sprintf("%.2f", x)
	}
	for _, vi := range r.Variants {
		row := fmt.Sprintf("| %s |", vi.Title)
		var slows, kept []string
		measured := false
		for _, d := range dirs {
			c := r.PktgenCell(vi.Name, d)
			if c == nil {
				row += " | | |"
				slows, kept = append(slows, "-"), append(kept, "-")
				continue
			}
			measured = true
			val := "no round kept"
			if why := r.pktgenReason(vi.Name, d); c.Stats.N == 0 && why != "" {
				val += ": " + tableText(why)
			}
			if c.Stats.N > 0 {
				m := fmt.Sprintf("%.0f", c.Stats.Median)
				if c.Variant != VariantDirect && c.Stats.Median == best[d] {
					m = "**" + m + "**"
				}
				val = fmt.Sprintf("%s ±%.2f%%", m, 100*c.Stats.Spread)
			}
			row += fmt.Sprintf(" %s | %s | %s |", val, ratio(c.VsDirect), ratio(c.VsDefault))
			var slow []float64
			for _, s := range r.Pktgen {
				if s.Variant == c.Variant && s.Direction.norm() == d && s.Kept {
					slow = append(slow, float64(s.SlowPathPackets))
				}
			}
			if len(slow) == 0 {
				slows = append(slows, "-")
			} else {
				slows = append(slows, fmt.Sprintf("%.0f", Summarize(slow).Median))
			}
			kept = append(kept, fmt.Sprintf("%d (%d)", c.Stats.N, c.Discarded))
		}
		if !measured {
			continue
		}
		slowText := strings.Join(slows, " / ")
		if vi.Name == VariantDirect {
			slowText = "n/a (no node)"
		}
		w("%s %s | %s |", row, slowText, strings.Join(kept, " / "))
	}
	w("")
	if len(dirs) > 1 {
		var t []string
		for _, d := range dirs {
			t = append(t, d.Title())
		}
		w("Slow-path packets per round and rounds kept (discarded): %s.", strings.Join(t, " / "))
		w("")
	}
	for _, d := range dirs {
		if v := rep.pktgenVerdicts(r, d); v != "" {
			if len(dirs) > 1 {
				v = d.Title() + ": " + v
			}
			w("%s", v)
			w("")
		}
	}
}

func directionsText(dirs []Direction) string {
	var s []string
	for _, d := range dirs {
		switch d {
		case PodToRemote:
			s = append(s, "Pod -> remote (a local Pod sends; the node's gateway in, its transport out, to a sink standing for the remote node and its Pod)")
		case RemoteToPod:
			s = append(s, "remote -> Pod (the remote node's Pod sends; the node's transport in, its gateway out, to the local Pod)")
		}
	}
	return strings.Join(s, "; ")
}

// pktgenVerdicts says, for one direction, how each hostaccel datapath stands against the
// target and how tc stands against the flowtable and Antrea's ruleset (issue 10's goals).
func (rep *Report) pktgenVerdicts(r *Run, d Direction) string {
	var verdicts []string
	for _, c := range r.PktgenCells {
		if c.Direction.norm() != d || !strings.HasPrefix(c.Variant, "hostaccel") || c.VsDirect < 0 {
			continue
		}
		v := "meets"
		if c.VsDirect < rep.Target {
			v = "does not meet"
		}
		verdicts = append(verdicts, fmt.Sprintf("%s reaches %.2f of the direct link: it %s the target of %.2f", title(r, c.Variant), c.VsDirect, v, rep.Target))
	}
	if tc := r.PktgenCell(VariantTC, d); tc != nil && tc.Stats.N > 0 {
		var cmp []string
		for _, other := range []string{VariantFlowtable, VariantAntrea} {
			o := r.PktgenCell(other, d)
			if o == nil || o.Stats.N == 0 {
				continue
			}
			side := "above"
			if tc.Stats.Median <= o.Stats.Median {
				side = "not above"
			}
			cmp = append(cmp, fmt.Sprintf("%s %s (%.2f)", side, title(r, other), o.VsDirect))
		}
		if len(cmp) > 0 {
			verdicts = append(verdicts, fmt.Sprintf("%s is %s", title(r, VariantTC), strings.Join(cmp, " and ")))
		}
		if f := r.PktgenCell(VariantFloor, d); f != nil && f.Stats.N > 0 && f.VsDirect >= 0 {
			verdicts = append(verdicts, fmt.Sprintf("%s reaches %.2f of the direct link, and %s %.2f of it",
				title(r, VariantFloor), f.VsDirect, title(r, VariantTC), tc.Stats.Median/f.Stats.Median))
		}
	}
	if len(verdicts) == 0 {
		return ""
	}
	return strings.Join(verdicts, "; ") + "."
}

// tableText makes an error message fit a Markdown table cell: its first line, no pipes,
// at most 160 characters.
func tableText(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	s = strings.ReplaceAll(s, "|", "/")
	if r := []rune(s); len(r) > 160 {
		s = string(r[:157]) + "..."
	}
	return s
}

// netperfSection is the seed 000 table: rows variant × traffic type, columns the tests.
func netperfSection(b *strings.Builder, r *Run) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	w("## netperf: %s", r.Label)
	w("")
	pin := "not pinned"
	if r.Pin.Enabled {
		pin = fmt.Sprintf("pinned: client and server on CPU %d (`%s`)", r.Pin.CPU, r.Pin.How)
	}
	reps := fmt.Sprintf("%d repetitions per cell", r.Reps)
	if r.Boots > 1 {
		reps += fmt.Sprintf(" (%d boots of the VM, %d each)", r.Boots, r.Reps/r.Boots)
	}
	if r.PhaseSpread > 0 && r.Reps > 1 {
		reps += fmt.Sprintf(", each repetition starting %s later after the install than the one before (the kernel's once-a-second work at every phase of a cell)", time.Duration(r.PhaseSpread*float64(time.Second))/time.Duration(r.Reps/max(r.Boots, 1)))
	}
	w("%d s per run, %s, variants interleaved; %s. Default path: conntrack, kube-proxy-like NAT for the Services, %d forward rules.", int(math.Round(r.Duration)), reps, pin, r.Rules)
	w("")
	var tests []string
	for _, t := range Tests {
		if slices.ContainsFunc(r.Cells, func(c Cell) bool { return c.Test == t }) {
			tests = append(tests, t)
		}
	}
	head := "| Variant | Traffic Type |"
	sep := "| --- | --- |"
	for _, t := range tests {
		head += fmt.Sprintf(" %s (%s) |", t, Unit(t))
		sep += " --- |"
	}
	w("%s", head)
	w("%s", sep)
	variants := ran(r)
	for _, t := range allTraffics() {
		best := map[string]float64{}
		for _, test := range tests {
			for _, v := range variants {
				if v.Name == VariantLoopback { // a limit, never bold
					continue
				}
				if c := r.Cell(v.Name, t, test); c != nil && c.Stats.N > 0 {
					best[test] = math.Max(best[test], c.Stats.Median)
				}
			}
		}
		for _, v := range variants {
			if v.Name == VariantDirect || !slices.ContainsFunc(r.Cells, func(c Cell) bool { return c.Variant == v.Name && c.Traffic == t }) {
				continue
			}
			row := fmt.Sprintf("| %s | %s |", v.Title, t.Title())
			for _, test := range tests {
				row += " " + cellText(r.Cell(v.Name, t, test), r.Cell(VariantDefault, t, test), v.Name != VariantDefault, best[test]) + " |"
			}
			w("%s", row)
		}
	}
	if slices.ContainsFunc(r.Cells, func(c Cell) bool { return c.Traffic == DirectLink }) {
		row := fmt.Sprintf("| %s | %s |", title(r, VariantDirect), DirectLink.Title())
		for _, test := range tests {
			row += " " + cellText(r.Cell(VariantDirect, DirectLink, test), r.Cell(VariantDefault, PodToPod, test), true, -1) + " |"
		}
		w("%s", row)
	}
	w("")
	w("The direct link is the limit (no node on the path; its %% is against Default Pod-to-Pod) and is never bold; so is the loopback in one Pod, the same-node limit.")
	var skipped []string
	for _, v := range r.Variants {
		if !v.Ran {
			skipped = append(skipped, fmt.Sprintf("%s: %s", v.Title, v.Skipped))
		}
	}
	if len(skipped) > 0 {
		w("Not measured in this kernel: %s.", strings.Join(skipped, "; "))
	}
	for _, n := range r.Notes {
		w("%s", n)
	}
	w("")
}

func cellText(c, def *Cell, pct bool, best float64) string {
	if c == nil {
		return ""
	}
	if c.Stats.N == 0 {
		return fmt.Sprintf("error (all %d runs failed: %s)", c.Errors, c.errorText())
	}
	v := fmtValue(c.Stats.Median)
	if best > 0 && c.Stats.Median == best {
		v = "**" + v + "**"
	}
	if pct && def != nil && def.Stats.N > 0 {
		v += " (" + fmtPct(Change(c.Stats.Median, def.Stats.Median)) + ")"
	}
	v += fmt.Sprintf(" ±%.1f%%", 100*c.Stats.Spread)
	if c.Errors > 0 {
		v += fmt.Sprintf(" [%d failed: %s]", c.Errors, c.errorText())
	}
	return v
}

// errorText is why the cell's runs failed, for its table cell.
func (c *Cell) errorText() string {
	if c.FirstError == "" {
		return "no reason recorded"
	}
	return c.FirstError
}

// pathSection shows the counters: the share of the nodes' packets that took the normal
// (forward hook) path, and that the direct link did not touch a node.
func pathSection(b *strings.Builder, r *Run) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	if !slices.ContainsFunc(r.Cells, func(c Cell) bool { return !c.Traffic.local() }) {
		return // the same-node traffic has no path evidence
	}
	w("### Which path the packets took (%s)", r.Env)
	w("")
	w("Share of the packets the nodes on the path received that went through their forward hook (counted by the bench's own forward chain, right after the node's forward rules; offloaded packets skip it), median over the repetitions: 100%% is the normal path, near 0%% offloaded. For the direct link: the most packets the nodes received while it ran (0, or the odd neighbour probe of their own, against tens of thousands it moved: no node was touched).")
	w("")
	head, sep := "| Variant | Traffic Type |", "| --- | --- |"
	for _, t := range Tests {
		head += " " + t + " |"
		sep += " --- |"
	}
	w("%s", head)
	w("%s", sep)
	for _, t := range append(allTraffics(), DirectLink) {
		if t.local() {
			continue // no path evidence for the same-node traffic
		}
		for _, v := range ran(r) {
			if !slices.ContainsFunc(r.Cells, func(c Cell) bool { return c.Variant == v.Name && c.Traffic == t }) {
				continue
			}
			row := fmt.Sprintf("| %s | %s |", v.Title, t.Title())
			for _, test := range Tests {
				c := r.Cell(v.Name, t, test)
				switch {
				case c == nil:
					row += " |"
				case t == DirectLink:
					var pk []float64
					for _, s := range r.Samples {
						if s.Variant == v.Name && s.Traffic == t && s.Test == test && s.Path != nil {
							pk = append(pk, float64(s.Path.NodePackets))
						}
					}
					row += fmt.Sprintf(" %.0f packets |", Summarize(pk).Max)
				case c.SlowShare < 0:
					row += " n/a |"
				default:
					row += fmt.Sprintf(" %.1f%% |", 100*c.SlowShare)
				}
			}
			w("%s", row)
		}
	}
	w("")
}

func (rep *Report) machineSection(b *strings.Builder) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	w("## Machine")
	w("")
	w("| | %s |", strings.Join(mapRuns(rep.Runs, func(r *Run) string { return r.Env }), " | "))
	w("| --- |%s", strings.Repeat(" --- |", len(rep.Runs)))
	rows := []struct {
		k string
		f func(m Machine) string
	}{
		{"kernel", func(m Machine) string { return m.Kernel + " " + m.KernelVersion }},
		{"CPU", func(m Machine) string { return m.CPU }},
		{"CPUs", func(m Machine) string { return fmt.Sprint(m.CPUs) }},
		{"memory", func(m Machine) string { return fmt.Sprintf("%d MiB", m.MemoryMiB) }},
		{"OS", func(m Machine) string { return m.OS }},
		{"hypervisor", func(m Machine) string { return m.Hypervisor }},
		{"netperf", func(m Machine) string { return m.Netperf }},
		{"nft", func(m Machine) string { return m.Nft }},
		{"qemu", func(m Machine) string { return m.Qemu }},
		{"Go", func(m Machine) string { return m.Go }},
	}
	for _, row := range rows {
		w("| %s | %s |", row.k, strings.Join(mapRuns(rep.Runs, func(r *Run) string { return row.f(r.Machine) }), " | "))
	}
	w("| pinning | %s |", strings.Join(mapRuns(rep.Runs, func(r *Run) string {
		if !r.Pin.Enabled {
			return "none"
		}
		return fmt.Sprintf("CPU %d", r.Pin.CPU)
	}), " | "))
	w("")
}

func mapRuns(rs []*Run, f func(*Run) string) []string {
	var out []string
	for _, r := range rs {
		out = append(out, strings.ReplaceAll(f(r), "|", "/"))
	}
	return out
}

func (rep *Report) methodSection(b *strings.Builder) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	nodes, rules := 0, 0
	if len(rep.Runs) > 0 {
		nodes, rules = rep.Runs[0].Nodes, rep.Runs[0].Rules
	}
	w("## Method")
	w("")
	w("- Cluster: %d nodes (network namespaces), each with a gateway `gw` to its Pod and a transport `eth0` on a shared bridge, noEncap routing between the Pod CIDRs (10.244.N.0/24), an external client on the bridge. The netperf client is the Pod on node1 (or the external client), netserver runs in the Pod on node2. Pod-to-Service goes to ClusterIP 10.96.0.10 (DNAT on node1); External-to-NodePort to node2's IP, NodePort %d (DNAT and masquerade on node2); External-to-LoadBalancer (dnat) to VIP %s, a dnat service of hostaccel's load balancer (internal/lb) on node2, present for every variant.", nodes, NodePortCtrl, LoadBalancerVIP)
	w("- Default path on every node: conntrack (with accounting), a kube-proxy-like ruleset in its nftables mode's shape (`table ip %s`: verdict maps, a chain per Service port and endpoint, masquerade by mark) and `table inet %s` with %d forward rules that never match. The bench adds `table inet %s` (a counter in a forward chain after those rules, and one for new DNATed connections) to see which path packets took.", KubeProxyTable, NodeFilterTable, rules, CountersTable)
	w("- Every other variant is installed on top of the default path on every node (what that project adds to such a node), and removed again after its cells; the direct link is a client and a server on one veth.")
	w("- Pinning: on these virtual machines an idle vCPU's wake-up dominates request/response tests (TCP_RR between namespaces: about 9k/s unpinned against 80-95k/s with client and server on the same CPU), and only pinned runs separate the variants, so netperf and netserver are pinned to one CPU by default (`taskset -c N netperf ... -T N,N`).")
	w("- The VM is the project's qemu TCG VM (vmtest/run-in-vm.sh) with the Debian cloud kernel, which has the nftables flowtable this host lacks. With `-i` (icount) the guest's clock follows its instruction count: its numbers repeat to a fraction of a percent and are per-instruction costs, not speed; they are compared only with each other.")
	w("- The conntrack table of every node is flushed before every sample; each sample records its counter deltas (JSON: `path`).")
	w("")
}

func rulesetSection(b *strings.Builder, runs []*Run) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	w("## Variants and what they install (first node)")
	w("")
	seen := map[string]bool{}
	// A variant that installs something else per kernel (auto chooses by what it has) is
	// shown once per kernel.
	texts := map[string]map[string]bool{}
	for _, r := range runs {
		for _, v := range r.Variants {
			if v.Ruleset != "" {
				if texts[v.Name] == nil {
					texts[v.Name] = map[string]bool{}
				}
				texts[v.Name][v.Ruleset] = true
			}
		}
	}
	for _, r := range runs {
		if r.DefaultRuleset != "" && !seen["default"] {
			seen["default"] = true
			w("<details><summary>Default path (%d forward rules, %s)</summary>", r.Rules, r.Env)
			w("")
			w("```")
			w("%s", shortenRules(r.DefaultRuleset))
			w("```")
			w("</details>")
			w("")
		}
		for _, v := range r.Variants {
			if seen[v.Name+"\x00"+v.Ruleset] || (v.Ruleset == "" && seen[v.Name]) {
				continue
			}
			if v.Ruleset == "" && v.Ran {
				seen[v.Name] = true
				w("- **%s**: %s", v.Title, v.Note)
				w("")
				continue
			}
			if v.Ruleset == "" {
				continue
			}
			name := v.Title
			if len(texts[v.Name]) > 1 {
				name += " (" + r.Env + ")"
			}
			seen[v.Name], seen[v.Name+"\x00"+v.Ruleset] = true, true
			w("<details><summary>%s: %s</summary>", name, v.Note)
			w("")
			w("```")
			w("%s", strings.TrimRight(v.Ruleset, "\n"))
			w("```")
			w("</details>")
			w("")
		}
	}
}

// shortenRules elides the middle of the long list of never-matching forward rules.
func shortenRules(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var idx []int
	for i, l := range lines {
		if strings.Contains(l, "ip saddr 10.255.") {
			idx = append(idx, i)
		}
	}
	if len(idx) <= 5 {
		return strings.Join(lines, "\n")
	}
	first, last := idx[3], idx[len(idx)-2]
	out := append(slices.Clone(lines[:first]), fmt.Sprintf("\t\t# ... %d more rules like these ...", last-first+1))
	return strings.Join(append(out, lines[last+1:]...), "\n")
}
