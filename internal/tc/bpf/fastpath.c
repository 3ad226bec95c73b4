//go:build ignore

// SPDX-License-Identifier: GPL-2.0
//
// hostaccel's tc fastpath: a stateless router at tc ingress of the gateway and transport
// devices. Packets of the enabled classes (local Pod CIDRs <-> peer Pod CIDRs, peer nodes ->
// local Pods) are routed by the kernel's FIB, get their TTL / hop limit decremented and are
// redirected to the output device with bpf_redirect_neigh, which fills in the MACs from the
// neighbour table. Everything else is handed on untouched (TC_ACT_UNSPEC: the next tcx program
// or tc filter runs, then the stack).
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10

/* Not ours: let the next program, filter or the stack have it. */
#define PASS TC_ACT_UNSPEC

enum role {
	ROLE_GATEWAY = 1,
	ROLE_TRANSPORT = 2,
};

enum class {
	CLASS_POD_TO_POD = 0,
	CLASS_NODE_TO_REMOTE_POD = 1,
	NUM_CLASSES,
};

/* stats indices: class*2 + family (0: IPv4, 1: IPv6), then why packets of a class were not
 * redirected, then the packets redirected along the agent's route because forwarding is off. */
enum stat {
	STAT_EXCLUDED = NUM_CLASSES * 2,
	STAT_TTL,            /* TTL / hop limit <= 1: the stack sends time exceeded */
	STAT_NO_NEIGH,       /* next hop unresolved: the stack resolves it */
	STAT_FRAG_NEEDED,    /* larger than the output MTU: the stack sends the ICMP error */
	STAT_NO_ROUTE,       /* no usable route, or it leaves through a device that is not ours */
	STAT_FORWARDING_OFF, /* redirected along the agent's route: the FIB refused (forwarding off) */
	NUM_STATS,
};

struct iface {
	__u32 role;
	__u32 flags; /* IFACE_OWN_CLSACT: hostaccel created the clsact qdisc (cls_bpf mode) */
};

struct lpm4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm6 {
	__u32 prefixlen;
	__u8 addr[16];
};

struct settings {
	__u32 classes; /* bit (1 << class) set: class enabled */
	__u32 pad;
	__u64 build; /* hash of the object this program set was loaded from (agent bookkeeping) */
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* ingress ifindex -> role */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct iface);
} ifaces SEC(".maps");

/* Address sets. The value of local_pod, peer_pod and peer_node is the ifindex the node routes
 * the prefix through (0: unknown), used only when the FIB refuses to route (forwarding off). */
#define LPM(name, keytype, n)                                      \
	struct {                                               \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);           \
		__uint(max_entries, n);                        \
		__uint(map_flags, BPF_F_NO_PREALLOC);          \
		__type(key, struct keytype);                   \
		__type(value, __u32);                          \
	} name SEC(".maps")

LPM(local_pod4, lpm4, 256);
LPM(peer_pod4, lpm4, 65536);
LPM(peer_node4, lpm4, 65536);
LPM(exclude4, lpm4, 16384);
LPM(local_pod6, lpm6, 256);
LPM(peer_pod6, lpm6, 65536);
LPM(peer_node6, lpm6, 65536);
LPM(exclude6, lpm6, 16384);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_STATS);
	__type(key, __u32);
	__type(value, struct counter);
} stats SEC(".maps");

static __always_inline void count(__u32 idx, struct __sk_buff *skb)
{
	struct counter *c = bpf_map_lookup_elem(&stats, &idx);

	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
}

/* classify returns the class of a packet from src to dst arriving on a device of role, or -1,
 * and sets *egress to the agent's route for dst. */
static __always_inline int classify(enum role role, void *local_pod, void *peer_pod,
				    void *peer_node, void *src, void *dst, __u32 *egress)
{
	__u32 *e;

	if (role == ROLE_GATEWAY) {
		if (!bpf_map_lookup_elem(local_pod, src))
			return -1;
		if ((e = bpf_map_lookup_elem(peer_pod, dst))) {
			*egress = *e;
			return CLASS_POD_TO_POD;
		}
		if ((e = bpf_map_lookup_elem(peer_node, dst))) {
			*egress = *e;
			return CLASS_NODE_TO_REMOTE_POD;
		}
		return -1;
	}
	if (!(e = bpf_map_lookup_elem(local_pod, dst)))
		return -1;
	*egress = *e;
	if (bpf_map_lookup_elem(peer_pod, src))
		return CLASS_POD_TO_POD;
	if (bpf_map_lookup_elem(peer_node, src))
		return CLASS_NODE_TO_REMOTE_POD;
	return -1;
}

/* route decides the output device: the FIB's (with its next hop in *nh), or, where the FIB
 * refuses because forwarding is disabled, the agent's route (*nh left empty: then
 * bpf_redirect_neigh looks up the next hop on that device itself). 0: pass. */
static __always_inline __u32 route(struct __sk_buff *skb, struct bpf_fib_lookup *fib,
				   __u32 egress, struct bpf_redir_neigh *nh)
{
	long rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	__u32 out, mtu = 0;

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		out = fib->ifindex;
		nh->nh_family = fib->family;
		if (fib->family == AF_INET)
			nh->ipv4_nh = fib->ipv4_dst;
		else
			__builtin_memcpy(nh->ipv6_nh, fib->ipv6_dst, sizeof(nh->ipv6_nh));
		break;
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		out = egress;
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		count(STAT_NO_NEIGH, skb);
		return 0;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		count(STAT_FRAG_NEEDED, skb);
		return 0;
	default:
		out = 0;
	}
	if (!out || !bpf_map_lookup_elem(&ifaces, &out)) {
		count(STAT_NO_ROUTE, skb);
		return 0;
	}
	/* The output device's MTU, for GSO packets by segment (the FIB did not check those). */
	if (bpf_check_mtu(skb, out, &mtu, 0, BPF_MTU_CHK_SEGS) != BPF_MTU_CHK_RET_SUCCESS) {
		count(STAT_FRAG_NEEDED, skb);
		return 0;
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		count(STAT_FORWARDING_OFF, skb);
	return out;
}

/* mtu_len is the length the FIB checks against the route's MTU. A GSO packet (a TCP
 * super-packet from a local socket or GRO) is larger than any MTU yet fine if its segments
 * fit: for those, 0 skips that check; route() checks their segments against the output
 * device. */
static __always_inline __u16 mtu_len(struct __sk_buff *skb, __u16 len)
{
	return skb->gso_size ? 0 : len;
}

static __always_inline int redirect(__u32 out, struct bpf_redir_neigh *nh)
{
	if (nh->nh_family)
		return bpf_redirect_neigh(out, nh, sizeof(*nh), 0);
	return bpf_redirect_neigh(out, NULL, 0, 0);
}

static __always_inline int forward4(struct __sk_buff *skb, enum role role, __u32 classes,
				    struct iphdr *ip, void *end)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	struct lpm4 src = {32}, dst = {32};
	__u32 egress = 0, out;
	__u8 ttl;
	int class;

	if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl != 5)
		return PASS;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return PASS;
	__builtin_memcpy(src.addr, &ip->saddr, 4);
	__builtin_memcpy(dst.addr, &ip->daddr, 4);
	class = classify(role, &local_pod4, &peer_pod4, &peer_node4, &src, &dst, &egress);
	if (class < 0 || !(classes & (1U << class)))
		return PASS;
	if (bpf_map_lookup_elem(&exclude4, &src) || bpf_map_lookup_elem(&exclude4, &dst)) {
		count(STAT_EXCLUDED, skb);
		return PASS;
	}
	ttl = ip->ttl;
	if (ttl <= 1) {
		count(STAT_TTL, skb);
		return PASS;
	}

	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.tot_len = mtu_len(skb, bpf_ntohs(ip->tot_len));
	fib.ipv4_src = ip->saddr;
	fib.ipv4_dst = ip->daddr;
	fib.ifindex = skb->ingress_ifindex;
	out = route(skb, &fib, egress, &nh);
	if (!out)
		return PASS;

	/* A router decrements the TTL; the checksum changes by the difference. */
	bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), bpf_htons(ttl << 8),
			    bpf_htons((ttl - 1) << 8), 2);
	ttl--;
	bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &ttl, 1, 0);
	count(class * 2, skb);
	return redirect(out, &nh);
}

static __always_inline int forward6(struct __sk_buff *skb, enum role role, __u32 classes,
				    struct ipv6hdr *ip6, void *end)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	struct lpm6 src = {128}, dst = {128};
	__u32 egress = 0, out;
	__u8 hops;
	int class;

	if ((void *)(ip6 + 1) > end || ip6->version != 6)
		return PASS;
	/* Extension headers (fragments included) take the normal path. */
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP)
		return PASS;
	__builtin_memcpy(src.addr, &ip6->saddr, 16);
	__builtin_memcpy(dst.addr, &ip6->daddr, 16);
	class = classify(role, &local_pod6, &peer_pod6, &peer_node6, &src, &dst, &egress);
	if (class < 0 || !(classes & (1U << class)))
		return PASS;
	if (bpf_map_lookup_elem(&exclude6, &src) || bpf_map_lookup_elem(&exclude6, &dst)) {
		count(STAT_EXCLUDED, skb);
		return PASS;
	}
	hops = ip6->hop_limit;
	if (hops <= 1) {
		count(STAT_TTL, skb);
		return PASS;
	}

	fib.family = AF_INET6;
	fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0fffffff);
	fib.l4_protocol = ip6->nexthdr;
	fib.tot_len = mtu_len(skb, sizeof(*ip6) + bpf_ntohs(ip6->payload_len));
	__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	fib.ifindex = skb->ingress_ifindex;
	out = route(skb, &fib, egress, &nh);
	if (!out)
		return PASS;

	hops--;
	bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, hop_limit), &hops, 1, 0);
	count(class * 2 + 1, skb);
	return redirect(out, &nh);
}

SEC("tc")
int hostaccel_fp(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct settings *cfg;
	struct iface *in;
	__u32 key = skb->ingress_ifindex;

	/* Only frames addressed to this device, and not VLAN-tagged ones (they belong to a VLAN
	 * device on top of it). */
	if (skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return PASS;
	if (!(in = bpf_map_lookup_elem(&ifaces, &key)))
		return PASS;
	key = 0;
	if (!(cfg = bpf_map_lookup_elem(&config, &key)) || !cfg->classes)
		return PASS;
	if ((void *)(eth + 1) > end)
		return PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return forward4(skb, in->role, cfg->classes, (void *)(eth + 1), end);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return forward6(skb, in->role, cfg->classes, (void *)(eth + 1), end);
	return PASS;
}

char _license[] SEC("license") = "GPL";
