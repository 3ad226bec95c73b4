package lb

import (
	"log/slog"
	"strings"
)

// A rewritten chain must be read back (Settle) before an edit of its rules can be told from
// ours: the cache compares the kernel's rendering of each rule (nft's JSON) with the last one
// read, and only nft can say how nft renders a rule. Listing a chain of the kernel, nft 1.0.6
// loads the whole ruleset: ~1 s of CPU at 5,000 services, after every change of a service's
// slot count (a drain, an endpoint that comes or goes); under a change every 1.5 s, 0.4 of a
// core. (A service chain is rehearsed instead now, rehearse.go: a few ms; shapes spare even
// that, and the listings of the chains that cannot be rehearsed.)
//
// But a service's chain holds the same rules as any other service's of the same shape
// (family, scheduler, protocol, slot count, topology) except for the service's name, which
// nft prints as written. So the cache learns each shape from what Settle reads, with the
// service's name (the stem of its chain's name) cut out of the rule's text and of its
// rendering; a rule of that shape is then predicted, not read, once another service's reading
// has matched the prediction (confirmed). A prediction that ever differs from a reading, or
// from a full read (an edit, or a shape learnt wrong), disables the shape: its chains are read
// back again. A name that also occurs elsewhere in a rule (a service named "ip") gives a shape
// of its own that no other service's reading confirms.

// maxShapes bounds kernelCache.shapes (past it, it starts over).
const maxShapes = 4096

type shape struct {
	expr      string // the rendering read, the stem cut out ("\x00")
	stem      string // of the service it was learnt from
	confirmed bool   // another service's reading matched what it predicts
	bad       bool   // a prediction differed from a reading: never used again
}

// stemOf is the service's name in the name of a service's chain ("svc-NAME-v4",
// "post-NAME-v6"); "": not a service's chain.
func stemOf(chain string) string {
	for _, p := range []string{"svc-", "post-"} {
		if s, ok := strings.CutPrefix(chain, p); ok {
			if i := strings.LastIndexByte(s, '-'); i > 0 {
				return s[:i]
			}
		}
	}
	return ""
}

// shapeOf is the shape of the rule text in chain of table ref, and the stem cut out of it.
func shapeOf(ref TableRef, chain, text string) (key, stem string, ok bool) {
	stem = stemOf(chain)
	if stem == "" || strings.ContainsRune(text, 0) {
		return "", "", false
	}
	cut := func(s string) string { return strings.ReplaceAll(s, stem, "\x00") }
	return string(ref.Family) + "\x01" + ref.Name + "\x01" + cut(chain) + "\x01" + cut(text), stem, true
}

// predict is the rendering of a rule of a confirmed shape.
func (c *kernelCache) predict(ref TableRef, chain, text string) (string, bool) {
	k, stem, ok := shapeOf(ref, chain, text)
	if !ok {
		return "", false
	}
	s := c.shapes[k]
	if s == nil || !s.confirmed || s.bad {
		return "", false
	}
	return strings.ReplaceAll(s.expr, "\x00", stem), true
}

// learn takes the rendering read of a rule: a new shape, a confirmation of one (another
// service's reading matched its prediction), or a difference that disables it.
func (c *kernelCache) learn(ref TableRef, chain, text, expr string) {
	k, stem, ok := shapeOf(ref, chain, text)
	if !ok || expr == "" || strings.ContainsRune(expr, 0) {
		return
	}
	s := c.shapes[k]
	switch {
	case s == nil:
		if c.shapes == nil || len(c.shapes) >= maxShapes {
			c.shapes = map[string]*shape{}
		}
		c.shapes[k] = &shape{expr: strings.ReplaceAll(expr, stem, "\x00"), stem: stem}
	case s.bad:
	case strings.ReplaceAll(s.expr, "\x00", stem) == expr:
		s.confirmed = s.confirmed || stem != s.stem
	default:
		s.bad = true
		slog.Debug("load balancer: a rule's rendering is not its shape's: chains of that shape are read back", "chain", chain, "read", expr, "predicted", strings.ReplaceAll(s.expr, "\x00", stem))
	}
}

// distrustShape disables the shape of a rule whose rendering differs from what the cache
// had of it (an edit, or a prediction that was wrong).
func (c *kernelCache) distrustShape(ref TableRef, chain, comment string) {
	if t := c.rendered[ref]; t != nil {
		for _, rl := range t.Rules {
			if rl.Chain == chain && rl.Comment != nil && *rl.Comment == comment {
				if k, _, ok := shapeOf(ref, chain, rl.Rule); ok && c.shapes[k] != nil {
					c.shapes[k].bad = true
					slog.Debug("load balancer: a rule was edited: chains of its shape are read back", "chain", chain)
				}
				return
			}
		}
	}
}

// texts are the texts of the rules of chains of table ref as the last apply rendered them,
// by chain and comment (a comment hashes its rule's text), for learnRules.
func (c *kernelCache) texts(ref TableRef, chains []string) map[ruleKey]string {
	t := c.rendered[ref]
	if t == nil {
		return nil
	}
	want := nameSet(chains)
	texts := map[ruleKey]string{}
	for _, rl := range t.Rules {
		if rl.Comment != nil && want[rl.Chain] {
			texts[ruleKey{ref, rl.Chain, *rl.Comment}] = rl.Rule
		}
	}
	return texts
}

// learnRules takes the renderings read of the rules of kt whose texts are known. They teach
// shapes even when their chain was rewritten since: the comment ties each to its text.
func (c *kernelCache) learnRules(ref TableRef, kt *kernelTable, texts map[ruleKey]string) {
	for name, ch := range kt.Chains {
		for _, rl := range ch.Rules {
			if text, ok := texts[ruleKey{ref, name, rl.Comment}]; ok {
				c.learn(ref, name, text, normExpr(rl.Expr))
			}
		}
	}
}
