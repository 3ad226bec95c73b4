package lb

import (
	"context"

	nftprobe "github.com/hostaccel/hostaccel/internal/probe"
)

// The kernel's negated lookup in a map (`key != @map`), which dsr, stateless-dnat and
// persistence render (their flow and client tables): Linux 6.1 refuses it ("Could not process
// rule: Invalid argument", and the whole transaction with it: its nft_lookup takes a map only
// to read its data), 6.18 takes it (nftprobe.HasMapNegation, the probe's nft_map_negation).

// needsMapNegation reports whether a service of svcs renders a negated map lookup: only then
// is the kernel asked (a dry run, once per process).
func needsMapNegation(svcs []Service) bool {
	for i := range svcs {
		if t := svcs[i].topology(); t == DSR || t == StatelessDNAT || svcs[i].Persistence != nil {
			return true
		}
	}
	return false
}

// kernelLacksMapNegation reports whether svcs need what the kernel refuses (Env.NoMapNegation).
func kernelLacksMapNegation(ctx context.Context, svcs []Service) bool {
	return needsMapNegation(svcs) && !nftprobe.HasMapNegation(ctx)
}
