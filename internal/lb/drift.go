package lb

import (
	"fmt"
	"maps"
	"slices"
)

// driftOf says how the kernel's table kt (nil: missing) differs from was, the table as this
// Manager's last successful apply left it: what someone else changed. The maps the datapath
// fills (flows, persistent clients) and counter values are not compared.
func (m *Manager) driftOf(ref TableRef, was, kt *kernelTable) []string {
	name := ref.String()
	if kt == nil {
		return []string{name + ": table missing"}
	}
	if kt.Comment != was.Comment {
		return []string{name + ": layout changed"}
	}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(was.Maps)) {
		wm, km := was.Maps[n], kt.Maps[n]
		kind := "map"
		if wm.IsSet {
			kind = "set"
		}
		switch {
		case wm.Dynamic || km != nil && km.Dynamic:
		case km == nil:
			out = append(out, fmt.Sprintf("%s: %s %s missing", name, kind, n))
		case km.Comment != wm.Comment:
			out = append(out, fmt.Sprintf("%s: %s %s replaced", name, kind, n))
		default:
			lost, extra := 0, 0
			for k, v := range wm.Elems {
				if kv, ok := km.Elems[k]; !ok || kv != v {
					lost++
				}
			}
			for k := range km.Elems {
				if _, ok := wm.Elems[k]; !ok {
					extra++
				}
			}
			if lost+extra > 0 {
				out = append(out, fmt.Sprintf("%s: %s %s: %d elements removed or changed, %d added", name, kind, n, lost, extra))
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(kt.Maps)) {
		if was.Maps[n] == nil {
			out = append(out, fmt.Sprintf("%s: %s added", name, n))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(was.Chains)) {
		wc, kc := was.Chains[n], kt.Chains[n]
		if kc == nil {
			out = append(out, fmt.Sprintf("%s: chain %s missing", name, n))
			continue
		}
		same := len(kc.Rules) == len(wc.Rules)
		for i := 0; same && i < len(wc.Rules); i++ {
			same = kc.Rules[i].Comment == wc.Rules[i].Comment && !m.cache.edited(ref, n, kc.Rules[i])
		}
		if !same {
			out = append(out, fmt.Sprintf("%s: chain %s: rules changed", name, n))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(kt.Chains)) {
		if was.Chains[n] == nil {
			out = append(out, fmt.Sprintf("%s: chain %s added", name, n))
		}
	}
	return out
}
