// Package probe finds out what the running kernel can do for hostaccel, without changing
// its configuration: nftables features are dry runs (nft --check, never committed), tc
// features are tried in a throwaway network namespace and eBPF features use cilium/ebpf's
// feature probes. It does not leave the host quite as it found it: as for nft itself, the
// kernel loads on demand the modules that the dry runs use (nf_conntrack, nft_ct, the
// flowtable's), and they stay loaded.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// Feature names.
const (
	NFTables         = "nf_tables"
	Flowtable        = "flowtable"
	FlowtableCounter = "flowtable_counter"
	NetdevFwd        = "netdev_fwd"
	Conntrack        = "conntrack"
	ClsBPF           = "cls_bpf"
	ClsFlower        = "cls_flower"
	TCX              = "tcx"
	RedirectNeigh    = "bpf_redirect_neigh"
	RedirectPeer     = "bpf_redirect_peer"
	ConntrackKfuncs  = "bpf_skb_ct_lookup"
	SockMap          = "sockmap"
)

// All lists every feature Run probes, in its order.
var All = []string{NFTables, Flowtable, FlowtableCounter, NetdevFwd, Conntrack, ClsBPF, ClsFlower, TCX, RedirectNeigh, RedirectPeer, ConntrackKfuncs, SockMap, SockMapFIONREAD, SockMapBound}

// Feature is the outcome of one probe.
type Feature struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Detail is the error seen and a remediation hint when the feature is missing.
	Detail string `json:"detail,omitempty"`
}

// Result is what Run found.
type Result struct {
	Kernel   string    `json:"kernel"`
	Features []Feature `json:"features"`
	// MissingCapabilities are those hostaccel needs (CAP_NET_ADMIN, CAP_SYS_ADMIN) that the
	// probing process lacks: features it could not probe for lack of them are not the
	// kernel's fault (Privilege).
	MissingCapabilities []string `json:"missingCapabilities,omitempty"`
}

// Has reports whether the named feature was found available.
func (r Result) Has(name string) bool { return r.Get(name).Available }

// Get returns the named feature, or an unavailable Feature with that name if it was not probed.
func (r Result) Get(name string) Feature {
	for _, f := range r.Features {
		if f.Name == name {
			return f
		}
	}
	return Feature{Name: name, Detail: "not probed"}
}

// WriteTable writes r as a human-readable table: feature, yes/no, detail.
func (r Result) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "kernel: %s\n", r.Kernel)
	if len(r.MissingCapabilities) > 0 {
		them := "it"
		if len(r.MissingCapabilities) > 1 {
			them = "them"
		}
		fmt.Fprintf(w, "this process lacks %s: the features that need %s are reported missing below, whatever the kernel can do\n", and(r.MissingCapabilities), them)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tAVAILABLE\tDETAIL")
	for _, f := range r.Features {
		yes := "no"
		if f.Available {
			yes = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, yes, f.Detail)
	}
	tw.Flush()
}

// Run probes the kernel of the current network namespace. It never fails: a probe that
// cannot run reports its feature as unavailable, with the reason in Detail. Without a
// deadline on ctx, Run gives up after 30 seconds.
func Run(ctx context.Context) Result {
	ctx, cancel := bounded(ctx)
	defer cancel()
	r := Privileges()
	r.Features = append(r.Features, probeNFT(ctx)...)
	r.Features = append(r.Features, probeTC(ctx)...)
	r.Features = append(r.Features, probeBPF()...)
	r.Features = append(r.Features, probeSockmapFIONREAD(ctx), probeSockmapBound())
	return r
}

// ForTC is Run for a config whose datapath is tc: the tc and BPF features only, which are all
// that the plan of a tc datapath looks at (datapath.Choose). The nftables probes (a dozen nft
// runs) and the sockmap's are left out: ~0.2 s of `apply`, whatever the config's size. The
// features left out are absent (Has: false), so what shows every feature uses Run. Of the
// nftables probes it keeps the one that loads nf_conntrack, where the conntrack core is not
// there yet (once per boot), so that it finds the conntrack kfuncs where Run does.
//
// Where the kernel answers a query of the loopback device's tcx programs (Linux >= 6.6; the
// query changes nothing), the tc datapath attaches with tcx and nothing else (tc.Manager), so
// the attach tests in a throwaway network namespace are left out too: cls_bpf and flower
// decide nothing there, and the namespace's tests took 15-45 ms of every one-shot `apply`
// (issue 13). Run still tries all of them.
func ForTC(ctx context.Context) Result {
	ctx, cancel := bounded(ctx)
	defer cancel()
	r := Privileges()
	if HaveTCX() == nil {
		r.Features = append(r.Features, Feature{Name: TCX, Available: true})
	} else {
		r.Features = append(r.Features, probeTC(ctx)...)
	}
	// Where nf_conntrack is a module, the conntrack kfuncs are in its BTF, which is there
	// only once it is loaded: Run's nft dry run of a conntrack rule loads it before Run reads
	// the BTF, and so must ForTC, or an `apply` on a freshly booted node found no kfuncs
	// until something else (`hostaccel probe`) loaded the module.
	loadConntrack(ctx)
	r.Features = append(r.Features, probeBPF()...)
	return r
}

// bounded gives ctx a deadline 30 seconds on if it has none.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

// Privileges is Run without probing the kernel: the kernel's release and the capabilities
// this process lacks, for a caller that uses no datapath (`apply` of a load balancer alone
// needs no datapath's probe, which takes ~0.2 s: nft dry runs, program loads, sockets).
func Privileges() Result {
	return Result{Kernel: kernelRelease(), MissingCapabilities: missingCaps()}
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown: " + err.Error()
	}
	return unix.ByteSliceToString(u.Release[:])
}

// releaseAtLeast reports whether a kernel release ("6.1.0-26-cloud-amd64") is major.minor or
// later; one it cannot read is taken as later (the probes decide).
func releaseAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if n, _ := fmt.Sscanf(release, "%d.%d", &ma, &mi); n != 2 {
		return true
	}
	return ma > major || ma == major && mi >= minor
}

// feature turns the outcome of a probe into a Feature; hint says how to get a missing one.
func feature(name string, err error, hint string) Feature {
	if err == nil {
		return Feature{Name: name, Available: true}
	}
	msg := oneLine(err.Error())
	// nft reports errno as text, so look at the text as well.
	if errors.Is(err, os.ErrPermission) || strings.Contains(strings.ToLower(msg), "operation not permitted") {
		hint = permissionHint()
	}
	if hint != "" {
		msg += "; " + hint
	}
	return Feature{Name: name, Detail: msg}
}

// try runs fn and turns a panic into an error, so that no probe can take the caller down.
func try(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("probe panicked: %v", p)
		}
	}()
	return fn()
}

// oneLine joins the lines of s with "; " and collapses runs of blanks.
func oneLine(s string) string {
	var lines []string
	for line := range strings.Lines(s) {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "; ")
}
