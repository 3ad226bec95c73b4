package probe

import (
	"errors"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
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
		return errors.Join(
			features.HaveMapType(ebpf.SockHash),
			features.HaveProgramType(ebpf.SkMsg),
			features.HaveProgramType(ebpf.SockOps))
	})
	return []Feature{
		feature(RedirectNeigh, helper(asm.FnRedirectNeigh), "needs Linux >= 5.10"),
		feature(RedirectPeer, helper(asm.FnRedirectPeer), "needs Linux >= 5.10"),
		feature(SockMap, sockmap, "needs CONFIG_BPF_STREAM_PARSER and CONFIG_NET_SOCK_MSG (sockhash, sk_msg, sock_ops)"),
	}
}
