package tc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// FuzzProgram runs arbitrary frames through the program (BPF_PROG_RUN, the maps of
// newProgEnv: local and peer Pod CIDRs, next hops kept for two peer Pods), arriving on a
// gateway or on a transport, and checks what must hold for every packet, whatever its bytes:
//   - a packet handed to the stack is handed on unchanged (not a byte written);
//   - only a TCP or UDP packet of a class is redirected: on a gateway from a local Pod to a
//     peer Pod, on a transport from a peer Pod to a local Pod;
//   - a redirected packet differs from what arrived only in its MACs and its TTL / hop limit,
//     one less (IPv4: the header checksum updated, as valid as it was);
//   - where the kernel checks it (Linux >= 6.11), skb->csum matches the packet returned.
//
// The seeds (valid frames of each kind, and odd ones) run with every `go test`;
// scripts/fuzz.sh fuzzes it (root).
func FuzzProgram(f *testing.F) {
	pod, remote := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	pod6, remote6 := netip.MustParseAddr("fd00:10:244:1::2"), netip.MustParseAddr("fd00:10:244:2::2")
	vip := netip.MustParseAddr("10.96.0.10")
	for _, fr := range [][]byte{
		frame(pod, remote, 64), frame(pod6, remote6, 64), frame(remote, pod, 64), frame(remote6, pod6, 64),
		frame(pod, remote, 1), frame(pod, vip, 64), frame(remote, vip, 64),
		tcpFrame(netip.AddrPortFrom(pod, 40000), netip.AddrPortFrom(remote, 80), 64, tcpACK),
		tcpFrame(netip.AddrPortFrom(remote6, 80), netip.AddrPortFrom(pod6, 40000), 64, tcpACK),
		tcpFrame(netip.AddrPortFrom(pod, 40001), netip.AddrPortFrom(vip, 80), 64, tcpSYN),
		frame(pod, remote, 64)[:14+20+4], // cut in the UDP header
	} {
		f.Add(fr, false)
		f.Add(fr, true)
	}
	opts := frame(pod, remote, 64) // IPv4 with an option word
	opts = append(opts[:14+20:14+20], append([]byte{1, 1, 1, 1}, opts[14+20:]...)...)
	opts[14] = 0x46
	f.Add(opts, false)
	frag := frame(pod, remote, 64)
	frag[14+6] = 0x20 // more fragments
	f.Add(frag, false)
	// IP versions the EtherType does not announce: the kernel drops them (ip_rcv, ipv6_rcv);
	// the program redirected them, by the full way and the express lanes, before it checked
	// the version (found by this fuzzer).
	for _, fr := range [][]byte{frame(pod, remote, 64), frame(pod6, remote6, 64)} {
		fr[14] = 0x30 | fr[14]&0xf
		f.Add(fr, false)
		f.Add(slices.Clone(fr), false)
	}

	p := newProgEnv(f)
	p.route(remote, 0)
	p.route(remote6, flagPeer)
	p.route(pod, 0)
	p.route(pod6, flagPeer)
	role := RoleGateway
	f.Fuzz(func(t *testing.T, in []byte, transport bool) {
		if len(in) < 14 || len(in) > 1514 {
			t.Skip("not an Ethernet frame the test run takes")
		}
		p.t = t // the env's helpers report to this input (inputs run one at a time)
		want := RoleGateway
		if transport {
			want = RoleTransport
		}
		if want != role { // as the agent does: the device's role, then a new generation
			p.must(p.set.putIface(lo, fastpathIface{Role: uint32(want), Mtu: 1500, Mtu6: 1500}))
			p.bump()
			role = want
		}
		out := make([]byte, len(in)+64)
		ret, err := p.set.prog.Run(&ebpf.RunOptions{Data: in, DataOut: out, Context: skbCtx{IngressIfindex: lo, Ifindex: lo}, Flags: p.runFlags})
		if errors.Is(err, unix.EBADMSG) {
			t.Fatalf("skb->csum left stale (EBADMSG): frame %x", in)
		}
		if errors.Is(err, unix.EINVAL) {
			t.Skip("the test run refuses this frame") // e.g. an IPv6 EtherType with no header
		}
		if err != nil {
			t.Fatal(err)
		}
		out = out[:len(in)]
		switch ret {
		case actUnspec:
			if !bytes.Equal(out, in) {
				t.Fatalf("handed to the stack changed:\n in %x\nout %x", in, out)
			}
		case actRedirect:
			checkRedirected(t, role, in, out)
		default:
			t.Fatalf("return %d, want TC_ACT_UNSPEC or TC_ACT_REDIRECT: frame %x", int32(ret), in)
		}
	})
}

// checkRedirected checks a redirected frame against the one that arrived on a device of role.
func checkRedirected(t *testing.T, role Role, in, out []byte) {
	t.Helper()
	var src, dst netip.Addr
	var proto byte
	var hdr int // the IP header's length
	switch binary.BigEndian.Uint16(in[12:]) {
	case 0x0800:
		if len(in) < 14+20 {
			t.Fatalf("redirected a cut IPv4 header: %x", in)
		}
		hdr = int(in[14]&0xf) * 4
		if in[14]>>4 != 4 || hdr < 20 || len(in) < 14+hdr {
			t.Fatalf("redirected a malformed IPv4 header: %x", in)
		}
		src, dst = netip.AddrFrom4([4]byte(in[14+12:])), netip.AddrFrom4([4]byte(in[14+16:]))
		proto = in[14+9]
		if out[14+8] != in[14+8]-1 || in[14+8] <= 1 {
			t.Fatalf("TTL %d -> %d, want one less (and more than 1 before)", in[14+8], out[14+8])
		}
		if (ipChecksum(in[14:14+hdr]) == 0) != (ipChecksum(out[14:14+hdr]) == 0) {
			t.Fatalf("the IPv4 header checksum's validity changed:\n in %x\nout %x", in[14:14+hdr], out[14:14+hdr])
		}
		same(t, in, out, 14+8, 14+10, 14+11) // TTL, checksum
	case 0x86dd:
		hdr = 40
		if len(in) < 14+hdr || in[14]>>4 != 6 {
			t.Fatalf("redirected a malformed IPv6 header: %x", in)
		}
		src, dst = netip.AddrFrom16([16]byte(in[14+8:])), netip.AddrFrom16([16]byte(in[14+24:]))
		proto = in[14+6]
		if out[14+7] != in[14+7]-1 || in[14+7] <= 1 {
			t.Fatalf("hop limit %d -> %d, want one less (and more than 1 before)", in[14+7], out[14+7])
		}
		same(t, in, out, 14+7) // hop limit
	default:
		t.Fatalf("redirected a frame of EtherType %#04x", binary.BigEndian.Uint16(in[12:]))
	}
	if proto != 6 && proto != 17 {
		t.Fatalf("redirected IP protocol %d", proto)
	}
	local := localPod.Contains(src) || localPod6.Contains(src)
	peer := peerPod.Contains(dst) || peerPod6.Contains(dst)
	if role == RoleTransport {
		local = localPod.Contains(dst) || localPod6.Contains(dst)
		peer = peerPod.Contains(src) || peerPod6.Contains(src)
	}
	if !local || !peer {
		t.Fatalf("redirected %v -> %v (%s), which is of no class", src, dst, role)
	}
}

// same fails unless in and out are equal after the MACs, but for the bytes at offsets.
func same(t *testing.T, in, out []byte, offsets ...int) {
	t.Helper()
	for i := 12; i < len(in); i++ {
		if in[i] != out[i] && !slices.Contains(offsets, i) {
			t.Fatalf("a redirected frame changed beyond its MACs and hops (byte %d):\n in %x\nout %x", i, in, out)
		}
	}
}
