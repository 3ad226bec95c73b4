package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// probeTable names the table of every dry run; nft --check never commits it.
const probeTable = "hostaccel-probe"

// conntrackMax exists once the conntrack core is loaded.
const conntrackMax = "/proc/sys/net/netfilter/nf_conntrack_max"

// probeNFT dry-runs nftables transactions with nft --check, like Antrea does to find out
// whether the flowtable is supported.
func probeNFT(ctx context.Context) []Feature {
	var inet knftables.Interface
	err := try(func() (err error) {
		inet, err = knftables.New(knftables.InetFamily, probeTable)
		return nftError(err)
	})
	fs := []Feature{feature(NFTables, err, "needs nf_tables (CONFIG_NF_TABLES) and nft >= 1.0.1")}
	if err != nil {
		err = errors.New("nf_tables unavailable")
		return append(fs,
			feature(Flowtable, err, ""),
			feature(FlowtableCounter, err, ""),
			feature(NetdevFwd, err, ""),
			feature(Conntrack, err, ""))
	}

	flowtable := func(priority knftables.FlowtableIngressPriority) error {
		return checkNFT(ctx, inet,
			&knftables.Flowtable{Name: "ft", Priority: &priority, Devices: []string{"lo"}},
			&knftables.Chain{
				Name:     "forward",
				Type:     knftables.PtrTo(knftables.FilterType),
				Hook:     knftables.PtrTo(knftables.ForwardHook),
				Priority: knftables.PtrTo(knftables.FilterPriority),
			},
			&knftables.Rule{Chain: "forward", Rule: "flow add @ft"})
	}

	err = flowtable(knftables.FilterIngressPriority)
	fs = append(fs, feature(Flowtable, err,
		"load nf_flow_table_inet and nft_flow_offload, or use a kernel with CONFIG_NF_FLOW_TABLE"))
	if err != nil {
		fs = append(fs, feature(FlowtableCounter, errors.New("flowtable unavailable"), ""))
	} else {
		// knftables has no flowtable flags, but writes Priority verbatim after
		// "hook ingress priority "; nft spells the counter flag "counter ;".
		// A kernel before 5.5 ignores the flags attribute it does not know: the check passes
		// and the flag is dropped, so the release must say 5.7 (where the counter came) too.
		err = flowtable(knftables.FilterIngressPriority + " ; counter")
		if err == nil && !releaseAtLeast(kernelRelease(), 5, 7) {
			err = fmt.Errorf("Linux %s accepts the flag but has no flowtable counters", kernelRelease())
		}
		fs = append(fs, feature(FlowtableCounter, err, "needs Linux >= 5.7 and an nft that knows flowtable counters"))
	}

	err = try(func() error {
		netdev, err := knftables.New(knftables.NetDevFamily, probeTable)
		if err != nil {
			return nftError(err)
		}
		return checkNFT(ctx, netdev,
			&knftables.Chain{
				Name:     "ingress",
				Type:     knftables.PtrTo(knftables.FilterType),
				Hook:     knftables.PtrTo(knftables.IngressHook),
				Device:   knftables.PtrTo("lo"),
				Priority: knftables.PtrTo(knftables.FilterPriority),
			},
			&knftables.Rule{Chain: "ingress", Rule: `fwd to "lo"`})
	})
	fs = append(fs, feature(NetdevFwd, err, "load nft_fwd_netdev (CONFIG_NFT_FWD_NETDEV)"))

	fs = append(fs, feature(Conntrack, probeConntrack(ctx, inet), "load nf_conntrack and nft_ct (CONFIG_NF_CONNTRACK, CONFIG_NFT_CT)"))
	return fs
}

// checkNFT dry-runs (nft --check) a transaction that adds the probe table and objs to nft's
// family: the kernel validates it, loading on demand the modules it uses, and commits nothing.
func checkNFT(ctx context.Context, nft knftables.Interface, objs ...knftables.Object) error {
	return try(func() error {
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		for _, o := range objs {
			tx.Add(o)
		}
		return nftError(nft.Check(ctx, tx))
	})
}

// probeConntrack dry-runs a rule that matches conntrack state (inet is of the inet family),
// for which the kernel loads nf_conntrack and nft_ct where they are modules not loaded yet, as
// it does for nft: nil if the conntrack core is there after it.
func probeConntrack(ctx context.Context, inet knftables.Interface) error {
	err := checkNFT(ctx, inet,
		&knftables.Chain{
			Name:     "output",
			Type:     knftables.PtrTo(knftables.FilterType),
			Hook:     knftables.PtrTo(knftables.OutputHook),
			Priority: knftables.PtrTo(knftables.FilterPriority),
		},
		&knftables.Rule{Chain: "output", Rule: "ct state established accept"})
	if err == nil {
		// After the check, which may have loaded nf_conntrack on demand.
		_, err = os.Stat(conntrackMax)
	}
	return err
}

// loadConntrack has the kernel load nf_conntrack as Run's conntrack probe does, for a caller
// that reads nf_conntrack's module BTF without Run's nftables probes (ForTC): the conntrack
// kfuncs are there only once the module is loaded. Where the conntrack core is there already
// (loaded, or built in), it runs nothing (a stat); else its nft runs are ~3, once per boot.
// Where it cannot (no nft, no privilege) the module stays as it is, as it does for Run.
func loadConntrack(ctx context.Context) {
	if _, err := os.Stat(conntrackMax); err == nil {
		return
	}
	_ = try(func() error {
		inet, err := knftables.New(knftables.InetFamily, probeTable)
		if err != nil {
			return err
		}
		return probeConntrack(ctx, inet)
	})
}

// nftError shortens an error of the nft binary, whose stderr quotes the input and marks
// the failing part, to its "Error:" messages.
func nftError(err error) error {
	if err == nil {
		return nil
	}
	var msgs []string
	for line := range strings.Lines(err.Error()) {
		if _, msg, ok := strings.Cut(line, "Error: "); ok {
			if msg = strings.TrimSpace(msg); !slices.Contains(msgs, msg) {
				msgs = append(msgs, msg)
			}
		}
	}
	if len(msgs) == 0 {
		return err
	}
	return errors.New("nft: " + strings.Join(msgs, "; "))
}
