package lb

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/nftdump"
	"github.com/hostaccel/hostaccel/internal/scratchns"
)

// Settle needs nft's rendering of the rules of a chain it rewrote (shapes.go), and nft 1.0.6
// lists the whole ruleset to print one chain: ~1 s of CPU at 5,000 services, for every chain
// whose shape is not yet known. An endpoint that goes not ready and is ready again a second
// later (a flapping readiness probe) rewrites its chain back before any reading sees the
// first rewrite, so its shape is never learnt and each flap costs a listing.
//
// So service chains are rehearsed instead: nft makes those of a table that Settle wants, with
// their rules and the maps, sets, counters and chains those name (no elements), in a network
// namespace of its own, empty but for them, and lists them there (a few ms for one). The rules
// are the ones the apply rendered, so the rendering is of our rules, not of what the kernel's
// chain holds by then: someone's edit made before Settle is drift at the next full read, where
// a reading of the kernel's chain took it as ours. A base chain, or a rule that names a device
// (which the empty namespace lacks), is read from the kernel as before, and so is a chain
// whose rehearsal fails and, when a rehearsal would cost more than the listing, every chain
// of a table (maxRehearsed).

// Rehearser runs an nft script in an empty network namespace of its own, then
// `nft --json list ARGS...` there, and returns what the listing printed (injectable for
// tests; nil: chains are read from the kernel).
type Rehearser func(ctx context.Context, script string, list ...string) ([]byte, error)

// ErrNoScratchNS: the Rehearser could not make a network namespace (the agent lacks
// CAP_SYS_ADMIN). The Manager then stops rehearsing: chains are read from the kernel.
var ErrNoScratchNS = errors.New("no throwaway network namespace")

// NFTRehearse is the real Rehearser: nft in a throwaway network namespace, at the lowest CPU
// priority when nothing waits for it (background).
func NFTRehearse(ctx context.Context, script string, list ...string) ([]byte, error) {
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() { // scratchns.Run may leave its thread locked: a goroutine of its own
		var r result
		err := scratchns.Run(func() error {
			if _, r.err = runNft(ctx, script, "-f", "-"); r.err == nil {
				r.out, r.err = runNft(ctx, "", append([]string{"--json", "list"}, list...)...)
			}
			return nil
		})
		if err != nil {
			r.err = fmt.Errorf("%w: %w", ErrNoScratchNS, err)
		}
		done <- r
	}()
	r := <-done
	return r.out, r.err
}

// maxRehearsed: more chains than that are rehearsed only when they are at most half of
// their table's. A rehearsal costs nft ~0.35 ms a chain (it makes and lists them), a listing
// of the kernel's ~0.2 ms a chain of the ruleset: when every service chain of 5,000 is
// rewritten at once (a config that changes them all), the rehearsal cost ~0.7 s of CPU more.
const maxRehearsed = 64

// rehearsalScript is an nft script that makes chains of a table and their rules.
type rehearsalScript struct {
	text  string
	rules map[string]int // per chain it makes, its rules
}

// rehearsal is the script that makes those of chains of t that can be rehearsed (not a base
// chain, no rule naming a device), their rules and what those name, in an empty ruleset;
// false when none can, or too many for a rehearsal to cost less than a listing.
func rehearsal(t *Table, chains []string) (rehearsalScript, bool) {
	want := nameSet(chains)
	byName := make(map[string]*knftables.Chain, len(chains))
	for _, c := range t.Chains {
		if want[c.Name] && c.Hook == nil {
			byName[c.Name] = c
		}
	}
	rules := map[string][]*knftables.Rule{}
	for _, rl := range t.Rules {
		if byName[rl.Chain] == nil {
			continue
		}
		for _, dev := range []string{"fwd to ", "dup to ", "iif ", "oif "} {
			if strings.Contains(" "+rl.Rule, " "+dev) {
				delete(byName, rl.Chain)
			}
		}
		rules[rl.Chain] = append(rules[rl.Chain], rl)
	}
	if len(byName) == 0 || len(byName) > maxRehearsed && 2*len(byName) > len(t.Chains) {
		return rehearsalScript{}, false
	}
	named := map[string]bool{} // what the rules name: sets and maps, counters, chains
	for c := range byName {
		for _, rl := range rules[c] {
			namesIn(rl.Rule, named)
		}
	}
	s := rehearsalScript{rules: make(map[string]int, len(byName))}
	var err error
	s.text, err = nftdump.Table(knftables.NewFake("", ""), func(tx *knftables.Transaction) {
		tx.Add(t.table())
		for _, st := range t.Sets {
			if named["@"+st.Name] {
				tx.Add(st)
			}
		}
		for _, mp := range t.Maps {
			if named["@"+mp.Name] {
				tx.Add(mp)
			}
		}
		for _, c := range t.Counters {
			if named["counter "+c.Name] {
				c2 := *c // the Fake sets its Handle
				tx.Add(&c2)
			}
		}
		for _, c := range t.Chains {
			switch {
			case byName[c.Name] != nil:
				tx.Add(c)
				s.rules[c.Name] = len(rules[c.Name])
			case c.Hook == nil && named["chain "+c.Name]:
				tx.Add(&knftables.Chain{Name: c.Name}) // a jump's target: empty
			}
		}
		for c := range byName {
			for _, rl := range rules[c] {
				tx.Add(rl)
			}
		}
	}, nil)
	if err != nil {
		return rehearsalScript{}, false
	}
	return s, true
}

// namesIn adds to named what rule names: "@set" (a set or map), "counter NAME" (a named
// counter), "chain NAME" (a goto's or jump's target).
func namesIn(rule string, named map[string]bool) {
	for _, p := range []struct{ prefix, kind string }{{"@", "@"}, {`counter name "`, "counter "}, {"counter name ", "counter "}, {"goto ", "chain "}, {"jump ", "chain "}} {
		for s := rule; ; {
			i := strings.Index(s, p.prefix)
			if i < 0 {
				break
			}
			s = s[i+len(p.prefix):]
			n := 0
			for n < len(s) && isNameByte(s[n]) {
				n++
			}
			if n > 0 {
				named[p.kind+s[:n]] = true
			}
		}
	}
}

// isNameByte reports whether b may continue a set's, map's, counter's or chain's name.
func isNameByte(b byte) bool {
	return b == '-' || b == '_' || b == '.' || b == '/' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
