package probe

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"

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
// once, when nf_conntrack is loaded.
func HaveConntrackKfuncs() error {
	var errs []error
	for _, load := range []func() (*btf.Spec, error){
		btf.LoadKernelSpec,
		func() (*btf.Spec, error) { return btf.LoadKernelModuleSpec("nf_conntrack") },
	} {
		spec, err := load()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var fn *btf.Func
		if err := spec.TypeByName("bpf_skb_ct_lookup", &fn); err == nil {
			if err := spec.TypeByName("bpf_ct_release", &fn); err == nil {
				return nil
			}
		}
	}
	if len(errs) == 2 {
		return fmt.Errorf("no kernel BTF: %w", errors.Join(errs...))
	}
	return errors.New("the kernel's BTF has no bpf_skb_ct_lookup")
}
