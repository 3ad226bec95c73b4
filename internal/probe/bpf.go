package probe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"

	"github.com/hostaccel/hostaccel/internal/nftlist"
	"github.com/hostaccel/hostaccel/internal/sockmap"
)

// probeBPF asks cilium/ebpf's feature probes about helpers and types the tc and sockmap
// datapaths need.
func probeBPF() []Feature {
	helper := func(fn asm.BuiltinFunc) error {
		return try(func() error {
			removeMemlock()
			return features.HaveProgramHelper(ebpf.SchedCLS, fn)
		})
	}
	sockmap := try(func() error {
		removeMemlock()
		_, cgErr := sockmap.CgroupRoot()
		return errors.Join(
			features.HaveMapType(ebpf.SockHash),
			features.HaveProgramType(ebpf.SkMsg),
			features.HaveProgramType(ebpf.SockOps),
			cgErr)
	})
	return []Feature{
		feature(RedirectNeigh, helper(asm.FnRedirectNeigh), "needs Linux >= 5.10"),
		feature(RedirectPeer, helper(asm.FnRedirectPeer), "needs Linux >= 5.10"),
		feature(ConntrackKfuncs, try(HaveConntrackKfuncs), "needs Linux >= 5.18 with BTF (CONFIG_DEBUG_INFO_BTF, and _MODULES when nf_conntrack is a module) and nf_conntrack loaded; without it the tc datapath cannot tell NAT-ed flows and auto keeps them off tc"),
		feature(SockMap, sockmap, "needs CONFIG_BPF_STREAM_PARSER and CONFIG_NET_SOCK_MSG (sockhash, sk_msg, sock_ops) and a cgroup v2 mount"),
	}
}

// HaveConntrackKfuncs reports (nil) whether the kernel offers the conntrack kfuncs the tc
// program uses to keep NAT-ed flows on the stack (bpf_skb_ct_lookup, bpf_ct_release; Linux >=
// 5.18): in vmlinux's BTF, or nf_conntrack's when it is a loaded module. The answer can change
// once, when nf_conntrack is loaded. A yes is kept for the process, and for the boot in
// KfuncsCache (reading the kernel's BTF is ~15 ms of every `apply` of a tc datapath): from
// vmlinux it holds until the next boot, from the module while the module is loaded.
func HaveConntrackKfuncs() error {
	if haveKfuncs.Load() || kfuncsCached(KfuncsCache) {
		haveKfuncs.Store(true)
		return nil
	}
	src, err := conntrackKfuncs()
	if err == nil {
		haveKfuncs.Store(true)
		rememberKfuncs(KfuncsCache, src)
	}
	return err
}

// haveKfuncs is HaveConntrackKfuncs's yes in this process.
var haveKfuncs atomic.Bool

// KfuncsCache is the file that keeps HaveConntrackKfuncs's yes for the boot (tmpfs).
var KfuncsCache = "/run/hostaccel/conntrack-kfuncs"

// kfuncsModule is where a loaded nf_conntrack module shows.
var kfuncsModule = "/sys/module/nf_conntrack"

// kfuncsCached reports whether path holds a yes of this boot whose source is still there.
func kfuncsCached(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	boot, src, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !ok || boot == "" || boot != nftlist.BootID() {
		return false
	}
	switch src {
	case "vmlinux":
		return true
	case "nf_conntrack":
		_, err := os.Stat(kfuncsModule)
		return err == nil
	}
	return false
}

// rememberKfuncs writes a yes from src to path (best effort: without it, the BTF is read
// again next time).
func rememberKfuncs(path, src string) {
	boot := nftlist.BootID()
	if boot == "" {
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		_ = os.WriteFile(path, []byte(boot+" "+src+"\n"), 0o644)
	}
}

// conntrackKfuncs reads the kernel's BTF for the kfuncs: where it found them (vmlinux or
// nf_conntrack), or why not.
func conntrackKfuncs() (string, error) {
	var errs []error
	for _, src := range []struct {
		name string
		load func() (*btf.Spec, error)
	}{
		{"vmlinux", btf.LoadKernelSpec},
		{"nf_conntrack", func() (*btf.Spec, error) { return btf.LoadKernelModuleSpec("nf_conntrack") }},
	} {
		spec, err := src.load()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var fn *btf.Func
		if err := spec.TypeByName("bpf_skb_ct_lookup", &fn); err == nil {
			if err := spec.TypeByName("bpf_ct_release", &fn); err == nil {
				return src.name, nil
			}
		}
	}
	if len(errs) == 2 {
		return "", fmt.Errorf("no kernel BTF: %w", errors.Join(errs...))
	}
	return "", errors.New("the kernel's BTF has no bpf_skb_ct_lookup")
}
