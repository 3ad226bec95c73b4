//go:build ignore

// SPDX-License-Identifier: GPL-2.0
//
// hostaccel's tc fastpath: a router at tc ingress of the gateway and transport devices.
// Packets of the enabled classes (local Pod CIDRs <-> peer Pod CIDRs, peer nodes <-> local
// Pods, local Pod <-> local Pod between two gateways) are routed by the kernel's FIB and sent
// straight to the output device with the MACs the FIB answered (bpf_redirect, or
// bpf_redirect_peer into a Pod's network namespace), their TTL / hop limit decremented. Packets of connections that this node's stack NATs (conntrack
// says so) and everything else are handed on untouched (TC_ACT_UNSPEC: the next tcx program
// or tc filter runs, then the stack).
//
// Per packet, the budget is: one hash lookup for the input device, one LPM lookup per address
// (it answers the address's roles and the agent's route at once), one conntrack lookup where
// it is enabled, one FIB lookup, one hash lookup for the output device.
#include <stddef.h>
#include <stdbool.h>
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
	ROLE_GATEWAY = 1,   /* towards the local Pods */
	ROLE_TRANSPORT = 2, /* towards peer nodes */
};

/* iface.flags */
enum iface_flag {
	/* Agent bookkeeping, unused here: hostaccel created the device's clsact qdisc. */
	IFACE_AGENT_CLSACT = 1 << 0,
	/* A veth whose peer lives in another network namespace (a Pod's): packets for it are
	 * moved straight to the peer's ingress with bpf_redirect_peer, skipping the per-CPU
	 * backlog a veth transmit goes through. */
	IFACE_PEER = 1 << 1,
	/* Its IPv6 MTU (mtu6: net.ipv6.conf.DEV.mtu, a router advertisement's) is below its MTU:
	 * IPv6 packets are checked against mtu6, and IPv6 GSO packets, whose segments only the
	 * device's MTU can be checked against here, go to the stack, which sends them in mtu6. */
	IFACE_MTU6_LOWER = 1 << 2,
};

/* addr.flags: the roles of an address. The agent stores each prefix with the roles of every
 * prefix that contains it, so the longest match answers all of them. */
enum addr_flag {
	ADDR_LOCAL_POD = 1 << 0,
	ADDR_PEER_POD = 1 << 1,
	ADDR_PEER_NODE = 1 << 2,
	ADDR_EXCLUDE = 1 << 3,
	/* an address of this node on a gateway (inside a local Pod CIDR): packets to it are the
	 * node's (masqueraded replies, the node's own connections), never a Pod's */
	ADDR_NODE = 1 << 4,
	/* a route that decides (part of) it depends on more than the destination (several next
	 * hops, a source prefix): the FIB's answer is kept per pair of addresses (the answer for
	 * that pair), never per destination for every source */
	ADDR_PAIR_ONLY = 1 << 5,
	/* a route with several next hops that the kernel picks by more than the addresses (the
	 * ports: fib_multipath_hash_policy 1; IPv6's flow label) decides some of it: no answer
	 * is kept, every packet asks the FIB (with its ports), as the kernel picks per flow. The
	 * agent sets ADDR_PAIR_ONLY with it. */
	ADDR_NO_KEEP = 1 << 6,
};

enum class {
	CLASS_POD_TO_POD = 0,
	CLASS_NODE_TO_REMOTE_POD = 1,
	CLASS_LOCAL_POD_TO_POD = 2, /* between two gateways of this node */
	NUM_CLASSES,
};

/* settings.nat_check: where the program asks conntrack whether the host stack NATs a flow. */
enum nat_check {
	NAT_CHECK_TOWARD_PODS = 1 << 0, /* packets arriving on a transport, for local Pods */
	NAT_CHECK_FROM_PODS = 1 << 1,   /* packets arriving on a gateway, from local Pods */
};

/* stats indices: class*2 + family (0: IPv4, 1: IPv6), then why packets of a class were not
 * redirected, then the packets redirected by a way other than the FIB's answer. */
enum stat {
	STAT_EXCLUDED = NUM_CLASSES * 2,
	STAT_TTL,            /* TTL / hop limit <= 1: the stack sends time exceeded */
	STAT_NO_NEIGH,       /* next hop unresolved: redirected with bpf_redirect_neigh, which resolves it */
	STAT_FRAG_NEEDED,    /* larger than the output MTU: the stack sends the ICMP error */
	STAT_NO_ROUTE,       /* no usable route, or it leaves through a device that is not ours */
	STAT_FORWARDING_OFF, /* redirected along the agent's route: the FIB refused (forwarding off) */
	STAT_NAT,            /* conntrack knows the flow as NATed by this node: the stack un-NATs it */
	STAT_PEER,           /* of the redirected: moved into a Pod's namespace with bpf_redirect_peer */
	STAT_NAT_CARRIED,    /* redirected, NAT-ed as conntrack says: a flow the flowtable offloaded */
	STAT_EXPRESS,        /* of the redirected: by the express lane (the agent sums the block below) */
	/* The express lane's packets, counted once: class*2 + family, then the same again for
	 * those moved into a Pod's namespace (the agent adds each to its class, the second block to
	 * STAT_PEER, both to STAT_EXPRESS). */
	STAT_EXPRESS_CLASS,
	/* The NAT express lane's packets (carried flows, struct nat_slot4), counted once, then
	 * those moved into a Pod's namespace (the agent adds both to STAT_NAT_CARRIED and
	 * STAT_EXPRESS, the second to STAT_PEER). */
	STAT_NAT_EXPRESS = STAT_EXPRESS_CLASS + NUM_CLASSES * 4,
	NUM_STATS = STAT_NAT_EXPRESS + 2,
};

struct iface {
	__u32 role;
	__u32 flags; /* enum iface_flag */
	__u32 mtu;   /* the device's MTU (the next-hop cache checks packets against it) */
	__u32 mtu6;  /* its IPv6 MTU: min(mtu, net.ipv6.conf.DEV.mtu) */
};

struct lpm4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm6 {
	__u32 prefixlen;
	__u8 addr[16];
};

struct addr {
	__u32 flags;  /* enum addr_flag */
	__u32 egress; /* the device the node routes the prefix through (0: unknown), used only
		       * when the FIB refuses to route (forwarding off) */
};

/* settings.flags */
enum settings_flag {
	/* The FIB's answers may be kept for a moment (struct nexthop): the agent sets it only
	 * where they depend on the destination alone (no policy routing rules, no route MTUs). */
	SETTINGS_NEXTHOP_CACHE = 1 << 0,
	/* Carry the established TCP flows this node NATs that the flowtable has offloaded
	 * (struct nat_flow): translated as conntrack's tuples say, and redirected. */
	SETTINGS_NAT_CARRY = 1 << 1,
};

struct settings {
	__u32 classes;    /* bit (1 << class) set: class enabled */
	__u32 nat_check;  /* enum nat_check */
	__u32 flags;      /* enum settings_flag */
	__u32 generation; /* bumped by every agent update: next-hop answers of older ones are void */
	__u64 build;      /* hash of the object this program set was loaded from (agent bookkeeping) */
	__u32 tick_ns;    /* a jiffy (the coarse clocks' resolution); 0: no express lane */
	__u32 handed_epoch; /* the mark remember() writes (handed_marks); from 1 */
	__u32 handed_since; /* marks below it are void */
	__u32 pad;
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* ingress ifindex -> role and flags */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct iface);
} ifaces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm4);
	__type(value, struct addr);
} addrs4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6);
	__type(value, struct addr);
} addrs6 SEC(".maps");

/* The agent's settings: the object's one writable global, so the program's .bss map (the agent
 * writes it whole, as an array of one element). A global is addressed by a constant: no map
 * lookup and no NULL check per packet (13 instructions fewer than a one-element array map). */
struct settings agent_settings;

/* The FIB's answer for a destination arriving on a device, kept for NEXTHOP_TTL_NS and until the
 * agent's next update: a packet that finds it skips bpf_fib_lookup and the output device's
 * lookup. MACs come only from the FIB's answers. */
struct nexthop_key {
	__u8 addr[16];
	__u32 ingress;
};

struct nexthop {
	__u64 expires;    /* bpf_ktime_get_coarse_ns() */
	__u32 generation; /* settings.generation when filled */
	__u32 ifindex;    /* output device */
	__u32 flags;      /* its iface flags */
	__u32 mtu;        /* its MTU */
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
};

#define NEXTHOP_TTL_NS 1000000000ULL

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nexthop_key);
	__type(value, struct nexthop);
} nexthops SEC(".maps");

/* What the program decided for a packet from one address to another arriving on a device:
 * the class and the kept next hop (its generation and expiry bound the entry). A packet that
 * finds its pair skips the roles of both addresses (two LPM lookups) and the next hop's lookup
 * for this one hash lookup; its TTL, its size and the NAT check (a reply to an end handed to
 * the stack takes the full path) are checked every packet. Only redirected packets enter it,
 * where next hops may be kept (SETTINGS_NEXTHOP_CACHE). */
struct pair_key4 {
	__u8 src[4];
	__u8 dst[4];
	__u32 ingress;
};

struct pair_key6 {
	__u8 src[16];
	__u8 dst[16];
	__u32 ingress;
};

struct pair {
	struct nexthop nh;
	__u32 class;
	__u32 dflags; /* the destination's roles (nat_checked) */
	__u32 role;   /* the device's (ifaces): a packet that finds its pair skips that lookup too */
	__u32 pad;
};

/* One map per family: IPv4's key is a third of IPv6's to hash and compare. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct pair_key4);
	__type(value, struct pair);
} pairs4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct pair_key6);
	__type(value, struct pair);
} pairs6 SEC(".maps");

/* A bit per hash of a pair key, set when the pair is kept: a packet whose bit is clear has no
 * pair and skips that lookup for an inlined array read (packets the program hands to the stack
 * never have one). The agent clears the bits when it bumps the generation (which voids every
 * pair): mapped into its memory (BPF_F_MMAPABLE), 128 KiB of zeros in one copy instead of
 * 16,384 element writes (~7 ms of every apply). */
#define PAIR_BITS_WORDS 16384 /* 2^20 bits */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PAIR_BITS_WORDS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} pair_bits SEC(".maps");

/* The express lane: per CPU, the pairs this CPU forwarded lately, direct-mapped by the pair's
 * hash (the pair maps' key), each with all a packet needs to be sent as its pair says. A packet
 * that finds its slot (same addresses and device, of the current generation, unexpired) is
 * checked for its size, its hops and the NAT check as a kept pair's are, then redirected: one
 * inlined hash, one per-CPU lookup, one counter, no struct flow built. Anything else (a slot
 * that holds another pair, an old one, any doubt) takes the pair maps' way, which fills the slot
 * where the pair holds. Per CPU, so that no other CPU writes a slot while it is read; the agent
 * never writes slots: its generation voids them. A slot's expiry is in jiffies, the cheapest
 * clock a program reads (bpf_ktime_get_coarse_ns costs a tenth of the packet's way here). */
#define SLOT_PEER 1        /* bpf_redirect_peer into a Pod's namespace */
#define SLOT_NAT_CHECKED 2 /* nat_checked: a packet to an end handed to the stack goes the pair's way */
#define SLOT_GSO_STACK 4   /* IFACE_MTU6_LOWER: GSO packets go the full way */

struct slot_way {
	__u64 until;      /* bpf_jiffies64(): used while below */
	__u32 generation; /* settings.generation of the pair */
	__u32 ifindex;    /* output device */
	__u32 mtu;
	__u16 stat;       /* the stats index its packets count in */
	__u8 flags;       /* SLOT_* */
	__u8 pad;
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
};

_Static_assert(offsetof(struct slot_way, dmac) % 8 == 0 &&
		       offsetof(struct slot_way, smac) == offsetof(struct slot_way, dmac) + ETH_ALEN,
	       "express() copies both MACs as one 12-byte block from an 8-aligned offset");

struct slot4 {
	struct pair_key4 k;
	__u32 pad;
	struct slot_way w;
};

struct slot6 {
	struct pair_key6 k;
	__u32 pad;
	struct slot_way w;
};

/* The slots per CPU (max_entries of both maps): the agent sets them at load time from the number
 * of CPUs (internal/tc slotsPerCPU: at most 4,096, fewer on large machines), a power of two, and
 * slot_mask to one less. */
#define SLOTS 4096
volatile const __u32 slot_mask = SLOTS - 1;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, struct slot4);
} slots4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, struct slot6);
} slots6 SEC(".maps");

/* The NAT express lane: per CPU, the carried flows (struct nat_flow, below) this CPU
 * translated lately, direct-mapped by the hash of the packet's addresses and ports, each with
 * what the packet becomes and the way it is sent (the flow's kept FIB answer). A TCP packet
 * without SYN, FIN or RST whose slot holds its addresses, ports and device, of the current
 * generation, within its answer's time (conntrack is asked again after HANDED_TTL_NS, as the
 * full way asks), not voided since (nat_voids), with hops left and that fits, is translated
 * and redirected: one hash, one per-CPU lookup, one array read, no LPM lookup, no conntrack
 * answer looked up. The full way fills the slot where it carries a packet by the flow's kept
 * answer. */
struct nat_slot4 {
	__be32 saddr, daddr; /* the packet's, as it arrives */
	__be16 sport, dport;
	__u32 ingress;
	__be32 nsaddr, ndaddr; /* what it becomes */
	__be16 nsport, ndport;
	__u32 addr_diff, port_diff; /* struct nat_flow's */
	__u32 voided;               /* nat_voids' word of the flow when filled */
	__u8 changes;               /* NAT_ADDRS, NAT_PORTS */
	__u8 pad[3];
	struct slot_way w;
};

struct nat_slot6 {
	__u8 saddr[16], daddr[16];
	__be16 sport, dport;
	__u32 ingress;
	__u8 nsaddr[16], ndaddr[16];
	__be16 nsport, ndport;
	__u32 addr_diff, port_diff;
	__u32 voided;
	__u8 changes;
	__u8 pad[3];
	struct slot_way w;
};

_Static_assert(offsetof(struct nat_slot4, w) % 8 == 0 && offsetof(struct nat_slot6, w) % 8 == 0,
	       "express() reads the way's MACs 8-aligned");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, struct nat_slot4);
} nat_slots4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, struct nat_slot6);
} nat_slots6 SEC(".maps");

/* A word per hash of a TCP flow's addresses and ports (nat_hash4, nat_hash6), bumped when the
 * full way sees a SYN, FIN or RST of the flow (carried() then forgets its kept answer): a NAT
 * slot filled before no longer holds, on any CPU. A shared array, not per CPU: the packet that
 * voids a flow may arrive on another CPU than the one whose slot holds it. */
#define NAT_VOIDS 65536

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NAT_VOIDS);
	__type(key, __u32);
	__type(value, __u32);
} nat_voids SEC(".maps");

/* One end of a connection: an address (IPv4 in the first 4 bytes), a port, a protocol. */
struct endpoint {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* What the program knows of a client end in handed: conntrack's answer about the last reply
 * it asked for, from which server end, and when. */
struct handed_end {
	__u64 asked;      /* bpf_ktime_get_coarse_ns() of the answer; 0: conntrack not asked yet */
	__u8 server[16];  /* the reply's source address ... */
	__be16 port;      /* ... and port */
	__u8 nat;         /* conntrack's answer: the flow is NAT-ed by this node */
	__u8 pad;
};

/* A kept answer is used for this long; then conntrack is asked again. Short, so that a
 * connection that replaced a NAT-ed one on the same ends (without a SYN the program saw) is
 * told apart soon, and far below any conntrack timeout, so that the answer stands for an
 * entry conntrack still holds. */
#define HANDED_TTL_NS 100000000ULL

/* The client ends of the connections whose packets this program handed to the stack on their
 * way from the Pods' side (a local Pod to a ClusterIP; a peer to a NodePort or the node): only
 * those connections can have been NAT-ed by the stack, so conntrack is asked only about packets
 * to such an end, their replies, and its answer is kept for HANDED_TTL_NS (a NAT-ed reply then
 * costs one hash lookup). Pure pod-to-pod flows never enter it and cost one lookup that misses
 * instead of a conntrack lookup. A TCP connection is entered by its SYN (which also voids a kept
 * answer: a new connection), UDP by its first datagram; every reply's lookup keeps the entry
 * fresh, so an entry is forgotten only when more than max_entries client ends were used more
 * recently (LRU). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct endpoint);
	__type(value, struct handed_end);
} handed SEC(".maps");

/* A TCP flow's packets as they arrive (one direction) ... */
struct nat_key {
	struct endpoint src, dst;
};

/* Flows to an end whose mark counts but that handed does not hold, which conntrack said are
 * not NAT-ed, and when (bpf_ktime_get_coarse_ns(); used for HANDED_TTL_NS). Such an end shares
 * its mark with a handed end, or was handed and then forgotten by the LRU: only conntrack tells
 * which, and a pair kept for the flow's two addresses (by a direct flow) may be used only for
 * the first. A flow is entered by decide() (one conntrack lookup per HANDED_TTL_NS), and
 * kept_pair() uses its pair while the answer is fresh; a handed entry for the end (its SYN seen
 * again) comes first. Kept per CPU, direct-mapped by the flow's hash: an inlined array read and
 * a compare, where a hash map's lookup of the 40-byte key cost ~350 instructions per packet (a
 * flow that loses its slot to another only asks conntrack again). */
struct direct_flow {
	struct nat_key k;
	__u64 asked;
};

#define DIRECT_FLOWS 4096

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DIRECT_FLOWS);
	__type(key, __u32);
	__type(value, struct direct_flow);
} direct_flows SEC(".maps");

/* ... and what they become: conntrack's answer about the flow, kept for HANDED_TTL_NS. A flow
 * is carried (translated and redirected here, as the flowtable would) only while conntrack
 * says it is NAT-ed by this node and offloaded by the flowtable (IPS_OFFLOAD: the flowtable's
 * rules chose it, made conntrack's window tracking liberal, and keep its entry alive; when its
 * flow times out, the packets that follow take the stack until the flowtable has it again).
 * SYN, FIN and RST always take the stack, so conntrack sees every change of state. */
struct nat_flow {
	__u64 asked; /* bpf_ktime_get_coarse_ns() of conntrack's answer */
	__u8 carry;   /* 0: not carried (the answer is kept too: one conntrack lookup per TTL) */
	__u8 changes; /* NAT_ADDRS, NAT_PORTS */
	__be16 sport, dport;
	__u8 saddr[16], daddr[16];
	/* The checksums' changes, one's complement sums of the words replaced (~old + new): the
	 * addresses' (the pseudo header's, and IPv4's header) and the ports'. */
	__u32 addr_diff, port_diff;
	/* The FIB's answer for the new destination, as the nexthops map keeps one (where the
	 * agent allows it: SETTINGS_NEXTHOP_CACHE), until the answer's TTL: filled by the first
	 * packet after each conntrack answer. ifindex 0: none yet. */
	struct nexthop nh;
};

#define NAT_ADDRS 1
#define NAT_PORTS 2

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nat_key);
	__type(value, struct nat_flow);
} nat_flows SEC(".maps");

/* A mark per hash of a client end (handed_mark): the epoch (settings.handed_epoch) in which
 * the end was last remembered, written before the end enters handed (by the program, or by the
 * agent for connections older than the program or than an epoch). An end whose mark is below
 * settings.handed_since was never handed, or not since the agent last aged the marks: pure
 * pod-to-pod flows skip the handed lookup for one inlined array read. Marks are whole values
 * that the program and the agent only ever set to the current epoch, so neither can undo the
 * other's (bits in shared words could be lost to the agent's read-modify-write). Aging
 * (internal/tc ageHanded): the agent starts a new epoch, marks the client ends of the NAT-ed
 * connections conntrack still holds with it, then moves handed_since up to it: the marks of
 * every end gone since are void at once. Without it the marks fill up (every DNS query to a
 * ClusterIP remembers a new end), and then every packet toward the Pods takes the handed
 * lookup. */
#define HANDED_MARKS 262144 /* 2^18: 2 MiB */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HANDED_MARKS);
	__type(key, __u32);
	__type(value, __u64);
} handed_marks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_STATS);
	__type(key, __u32);
	__type(value, struct counter);
} stats SEC(".maps");

/* Conntrack from BPF (Linux >= 5.18, nf_conntrack's BTF). The agent sets conntrack_kfuncs at
 * load time from the kernel's BTF; where it is 0 the verifier drops the lookup as dead code,
 * so the weak, unresolved kfuncs are never called (bpf_ksym_exists() on a kfunc needs a newer
 * kernel than 6.1). */
volatile const __u32 conntrack_kfuncs = 0;

/* What the program reads of a conntrack entry: its status and its two tuples (CO-RE: the
 * kernel's offsets; anything else of these types is unused). */
union nf_inet_addr {
	__u32 all[4];
} __attribute__((preserve_access_index));

union nf_conntrack_man_proto {
	__be16 all;
} __attribute__((preserve_access_index));

struct nf_conntrack_man {
	union nf_inet_addr u3;
	union nf_conntrack_man_proto u;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple {
	struct nf_conntrack_man src;
	struct {
		union nf_inet_addr u3;
		union {
			__be16 all;
		} u;
	} dst;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple_hash {
	struct nf_conntrack_tuple tuple;
} __attribute__((preserve_access_index));

struct nf_conn {
	struct nf_conntrack_tuple_hash tuplehash[2];
	unsigned long status;
} __attribute__((preserve_access_index));

struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

#define CT_OPTS_SZ 12 /* the size every kernel since 5.18 accepts */
#define IPS_CONFIRMED (1 << 3)
#define IPS_SRC_NAT (1 << 4)
#define IPS_DST_NAT (1 << 5)
#define IPS_DYING (1 << 9)
#define IPS_HELPER (1 << 13)
#define IPS_OFFLOAD (1 << 14)

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;

static __always_inline void count(__u32 idx, struct __sk_buff *skb)
{
	struct counter *c = bpf_map_lookup_elem(&stats, &idx);

	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
}

/* local_class reports whether a packet to an address with flags df, arriving on a device of
 * role, is local-pod-to-pod where that class is on: it came from a gateway, and goes to a
 * local Pod. (Where the class is off, a local Pod inside a peer Pod CIDR stays pod-to-pod.) */
static __always_inline bool local_class(__u32 role, __u32 df, __u32 classes)
{
	return role == ROLE_GATEWAY && (df & ADDR_LOCAL_POD) && (classes & (1U << CLASS_LOCAL_POD_TO_POD));
}

/* classify returns the class of a packet from an address with flags sf to one with flags df,
 * arriving on a device of role, or -1. */
static __always_inline int classify(__u32 role, __u32 sf, __u32 df, __u32 classes)
{
	__u32 local = role == ROLE_GATEWAY ? sf : df;
	__u32 remote = role == ROLE_GATEWAY ? df : sf;

	if (!(local & ADDR_LOCAL_POD))
		return -1;
	if (local_class(role, df, classes))
		return CLASS_LOCAL_POD_TO_POD;
	if (remote & ADDR_PEER_POD)
		return CLASS_POD_TO_POD;
	if (remote & ADDR_PEER_NODE)
		return CLASS_NODE_TO_REMOTE_POD;
	return -1;
}

/* natted asks conntrack whether this node NATs the packet's flow (either direction). Pure
 * pod-to-pod flows have no entry at all: both directions are redirected, so the stack never
 * sees them. */
static __always_inline bool natted(struct __sk_buff *skb, struct bpf_sock_tuple *t, __u32 tsz,
				   __u8 proto)
{
	struct bpf_ct_opts opts = {.netns_id = -1 /* BPF_F_CURRENT_NETNS */, .l4proto = proto};
	struct nf_conn *ct;
	bool nat;

	if (!conntrack_kfuncs)
		return false;
	ct = bpf_skb_ct_lookup(skb, t, tsz, &opts, CT_OPTS_SZ);
	if (!ct)
		return false;
	nat = ct->status & (IPS_SRC_NAT | IPS_DST_NAT);
	bpf_ct_release(ct);
	return nat;
}

static __always_inline bool check_nat(struct settings *cfg, __u32 role)
{
	return cfg->nat_check & (role == ROLE_GATEWAY ? NAT_CHECK_FROM_PODS : NAT_CHECK_TOWARD_PODS);
}

/* The program's hash of words (the pair maps' keys; the handed marks' mark_hash, below, on
 * two words): from HASH_SEED, hash_step per word, then hash_end. */
#define HASH_SEED 0x9e3779b9

static __always_inline __u32 hash_step(__u32 h, __u32 w)
{
	return (h ^ w) * 0x01000193;
}

static __always_inline __u32 hash_end(__u32 h)
{
	return h ^ (h >> 15);
}

/* words_hash hashes n words. */
static __always_inline __u32 words_hash(__u32 *w, int n)
{
	__u32 h = HASH_SEED;
	int i;

#pragma unroll
	for (i = 0; i < n; i++)
		h = hash_step(h, w[i]);
	return hash_end(h);
}

/* nat_hash4 is the NAT express lane's hash of an IPv4 TCP flow (nat_slots4, nat_voids): its
 * addresses and its ports' word, as the packet holds them. */
static __always_inline __u32 nat_hash4(__u32 saddr, __u32 daddr, __u32 ports)
{
	return hash_end(hash_step(hash_step(hash_step(HASH_SEED, saddr), daddr), ports));
}

/* nat_hash6 is nat_hash4 of an IPv6 flow, each address folded to one word (its four words
 * XOR-ed): a collision only costs a miss, the slot's key is compared whole. */
static __always_inline __u32 nat_hash6(const __u8 *saddr, const __u8 *daddr, __u32 ports)
{
	__u32 a[4], b[4];

	__builtin_memcpy(a, saddr, 16);
	__builtin_memcpy(b, daddr, 16);
	return nat_hash4(a[0] ^ a[1] ^ a[2] ^ a[3], b[0] ^ b[1] ^ b[2] ^ b[3], ports);
}

/* nat_void returns the word of nat_voids for a flow of hash h. */
static __always_inline __u32 *nat_void(__u32 h)
{
	__u32 i = h & (NAT_VOIDS - 1);

	return bpf_map_lookup_elem(&nat_voids, &i);
}

/* handed_slot returns the mark of handed_marks for an end of hash h. */
static __always_inline __u64 *handed_slot(__u32 h)
{
	__u32 i = h & (HANDED_MARKS - 1);

	return bpf_map_lookup_elem(&handed_marks, &i);
}

/* mark_hash is the hash of an end's mark: its address folded to one word (the four words
 * XOR-ed; an IPv4 address is its first word), then the port and protocol word. Two steps
 * instead of words_hash's five: a collision only costs the colliding end a handed lookup.
 * internal/tc handedSlot computes the same. */
static __always_inline __u32 mark_hash(__u32 addr, __be16 port, __u8 proto)
{
	return hash_end(hash_step(hash_step(HASH_SEED, addr), port | (__u32)proto << 16));
}

/* handed_mark returns the mark of handed_marks for e. */
static __always_inline __u64 *handed_mark(struct endpoint *e)
{
	__u32 w[4];

	__builtin_memcpy(w, e->addr, sizeof(w));
	return handed_slot(mark_hash(w[0] ^ w[1] ^ w[2] ^ w[3], e->port, e->proto));
}

/* remember records the sending end of a packet handed to the stack from the Pods' side. A TCP
 * SYN starts a new connection from that end: what was known of an older one is voided. */
static __always_inline void remember(struct settings *cfg, struct endpoint *e, bool syn)
{
	struct handed_end h = {};
	__u64 *mark = handed_mark(e);
	__u32 epoch = *(volatile __u32 *)&cfg->handed_epoch;

	if (mark && *mark != epoch)
		*mark = epoch;
	if (syn || !bpf_map_lookup_elem(&handed, e)) /* a hit refreshes the LRU */
		bpf_map_update_elem(&handed, e, &h, BPF_ANY);
}

/* marked reports whether e's mark is of the current epochs (or out of reach). */
static __always_inline bool marked(struct settings *cfg, struct endpoint *e)
{
	__u64 *mark = handed_mark(e);

	return !mark || *mark >= *(volatile __u32 *)&cfg->handed_since;
}

/* sender reports whether a packet from an address with flags sf arriving on a device of role
 * comes from the Pods' side of this node's classes: a local Pod on a gateway, a peer on a
 * transport. */
static __always_inline bool sender(__u32 role, __u32 sf)
{
	return sf & (role == ROLE_GATEWAY ? ADDR_LOCAL_POD : ADDR_PEER_POD | ADDR_PEER_NODE);
}

/* A GSO packet (a TCP super-packet from a local socket or GRO) is larger than any MTU yet fine
 * if its segments fit: the FIB checks only packets that are sent as they are (tot_len), the
 * rest is checked here by segment against the output device. */
static __always_inline bool fits(struct __sk_buff *skb, __u32 out)
{
	__u32 mtu = 0;

	return bpf_check_mtu(skb, out, &mtu, 0, BPF_MTU_CHK_SEGS) == BPF_MTU_CHK_RET_SUCCESS;
}

/* emit sends a routed packet with its MACs into the Pod's namespace (bpf_redirect_peer) or
 * out of the device. The caller has decremented the TTL. */
static __always_inline int emit(struct __sk_buff *skb, __u8 *dmac, __u8 *smac, __u32 ifindex, __u32 flags)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return TC_ACT_SHOT; /* cannot happen: the headers were read from this buffer */
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	if (flags & IFACE_PEER) {
		count(STAT_PEER, skb);
		return bpf_redirect_peer(ifindex, 0);
	}
	return bpf_redirect(ifindex, 0);
}

/* usable reports whether a kept FIB answer holds for the packet: it is of the agent's current
 * generation, and the packet fits its device (then the FIB path decides and counts). */
static __always_inline bool usable(struct __sk_buff *skb, struct settings *cfg, struct nexthop *nh,
				   __u16 tot_len)
{
	if (nh->generation != cfg->generation)
		return false;
	return skb->gso_size ? !(nh->flags & IFACE_MTU6_LOWER) && fits(skb, nh->ifindex) : tot_len <= nh->mtu;
}

/* cached returns the kept FIB answer for the packet, or NULL: none, too old, or the packet
 * does not fit its device (then the FIB path decides and counts). */
static __always_inline struct nexthop *cached(struct __sk_buff *skb, struct settings *cfg,
					      struct nexthop_key *k, __u16 tot_len)
{
	struct nexthop *nh;

	if (!(cfg->flags & SETTINGS_NEXTHOP_CACHE) || !(nh = bpf_map_lookup_elem(&nexthops, k)))
		return NULL;
	if (bpf_ktime_get_coarse_ns() > nh->expires || !usable(skb, cfg, nh, tot_len))
		return NULL;
	return nh;
}

/* answer fills nh with the FIB's answer (the MACs only ever from it), but for when it expires,
 * as of generation gen: the packet's, read before its lookups (an answer found while the agent
 * bumped the generation is of the older one, and void). An IPv6 answer keeps the device's
 * IPv6 MTU, which the FIB checked the packet against. */
static __always_inline void answer(struct nexthop *nh, __u32 gen, struct bpf_fib_lookup *fib,
				   struct iface *out)
{
	nh->generation = gen;
	nh->ifindex = fib->ifindex;
	if (fib->family == AF_INET6) {
		nh->flags = out->flags;
		nh->mtu = out->mtu6;
	} else {
		nh->flags = out->flags & ~IFACE_MTU6_LOWER;
		nh->mtu = out->mtu;
	}
	__builtin_memcpy(nh->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(nh->dmac, fib->dmac, ETH_ALEN);
}


/* route looks the packet up in the FIB and returns the output device's iface, or NULL to pass;
 * *how is the FIB's answer. Where the FIB refuses because forwarding is disabled, the agent's
 * route (egress) stands in, and bpf_redirect_neigh finds the next hop on that device. */
static __always_inline struct iface *route(struct __sk_buff *skb, struct bpf_fib_lookup *fib,
					   __u32 egress, long *how)
{
	struct iface *out;
	long rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH: /* ifindex and the next hop are filled in */
		break;
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		fib->ifindex = egress;
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		count(STAT_FRAG_NEEDED, skb);
		return NULL;
	default:
		fib->ifindex = 0;
	}
	*how = rc;
	if (!fib->ifindex || !(out = bpf_map_lookup_elem(&ifaces, &fib->ifindex))) {
		count(STAT_NO_ROUTE, skb);
		return NULL;
	}
	/* The FIB checked the length of packets sent as they are, not GSO ones, and nothing
	 * when it refused. */
	if ((skb->gso_size || rc == BPF_FIB_LKUP_RET_FWD_DISABLED) && !fits(skb, fib->ifindex)) {
		count(STAT_FRAG_NEEDED, skb);
		return NULL;
	}
	if (fib->family == AF_INET6 && (out->flags & IFACE_MTU6_LOWER) &&
	    (skb->gso_size || (rc == BPF_FIB_LKUP_RET_FWD_DISABLED && fib->tot_len > out->mtu6))) {
		count(STAT_FRAG_NEEDED, skb);
		return NULL;
	}
	return out;
}

/* finish sends a routed packet by the way the FIB's answer allows. */
static __always_inline int finish(struct __sk_buff *skb, struct bpf_fib_lookup *fib,
				  struct iface *out, long how)
{
	struct bpf_redir_neigh nh = {};

	if (how == BPF_FIB_LKUP_RET_SUCCESS)
		return emit(skb, fib->dmac, fib->smac, fib->ifindex, out->flags);
	if (how == BPF_FIB_LKUP_RET_FWD_DISABLED) {
		count(STAT_FORWARDING_OFF, skb);
		return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
	}
	/* NO_NEIGH: the neighbour code resolves the FIB's next hop, queueing meanwhile. */
	count(STAT_NO_NEIGH, skb);
	nh.nh_family = fib->family;
	if (fib->family == AF_INET)
		nh.ipv4_nh = fib->ipv4_dst;
	else
		__builtin_memcpy(nh.ipv6_nh, fib->ipv6_dst, sizeof(nh.ipv6_nh));
	return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
}

/* A packet's ends and TTL / hop limit, as both families share them. */
struct flow {
	struct endpoint src, dst; /* first, as in struct nat_key (direct_slot) */
	/* settings.generation as the packet arrived, before any lookup: what it decides is of that
	 * generation (the agent bumps it before and after it writes the maps) */
	__u32 gen;
	__u32 role; /* the ingress device's */
	__u8 v6;
	__u8 keep; /* the pair has no valid entry (kept_pair): keep what the full way decides */
	__u8 hops;
	__u8 opens;     /* a connection's first packet: UDP (no way to tell), or a TCP SYN */
	__u16 tcpflags; /* TCP: the header's flags; TCP_FLAGS_UNKNOWN where out of reach or not TCP */
};

_Static_assert(offsetof(struct flow, dst) == sizeof(struct endpoint) && sizeof(struct nat_key) == 2 * sizeof(struct endpoint),
	       "struct flow starts with struct nat_key's layout");

#define TCP_FLAGS_OFF 13 /* in the TCP header */
#define TCP_CSUM_OFF 16
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
#define TCP_FLAGS_UNKNOWN 0x1ff /* every flag, and a bit no header has */

/* tcp_flags returns the flags of a TCP header at l4 (end bounds the packet), or
 * TCP_FLAGS_UNKNOWN where they are out of reach or the packet is not TCP. */
static __always_inline __u16 tcp_flags(__u8 proto, __u8 *l4, void *end)
{
	if (proto != IPPROTO_TCP || (void *)(l4 + TCP_FLAGS_OFF + 1) > end)
		return TCP_FLAGS_UNKNOWN;
	return l4[TCP_FLAGS_OFF];
}

/* opens reports whether a packet with TCP flags flags may start a connection: any UDP
 * datagram, a TCP SYN without ACK, a TCP packet whose flags are out of reach (cannot tell:
 * remember it). */
static __always_inline __u8 opens(__u16 flags)
{
	return flags == TCP_FLAGS_UNKNOWN || (flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
}

/* tuple fills t with the packet's tuple and returns its size. */
static __always_inline __u32 tuple(struct flow *f, struct bpf_sock_tuple *t)
{
	if (f->v6) {
		__builtin_memcpy(t->ipv6.saddr, f->src.addr, 16);
		__builtin_memcpy(t->ipv6.daddr, f->dst.addr, 16);
		t->ipv6.sport = f->src.port;
		t->ipv6.dport = f->dst.port;
		return sizeof(t->ipv6);
	}
	__builtin_memcpy(&t->ipv4.saddr, f->src.addr, 4);
	__builtin_memcpy(&t->ipv4.daddr, f->dst.addr, 4);
	t->ipv4.sport = f->src.port;
	t->ipv4.dport = f->dst.port;
	return sizeof(t->ipv4);
}

/* natted_flow asks conntrack about f (natted), with the tuple of its family. */
static __always_inline bool natted_flow(struct __sk_buff *skb, struct flow *f)
{
	struct bpf_sock_tuple t = {};
	__u32 tsz = tuple(f, &t);

	return natted(skb, &t, tsz, f->src.proto);
}

/* same_addr compares two 16-byte addresses (no memcmp in BPF). */
static __always_inline bool same_addr(const __u8 *a, const __u8 *b)
{
	__u64 a0, a1, b0, b1;

	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

/* Read a conntrack address (16 bytes; IPv4 in the first 4) into a. */
#define CT_ADDR(a, u3)                                  \
	do {                                            \
		__u32 w_[4] = {(u3).all[0], 0, 0, 0};   \
		if (f->v6) {                            \
			w_[1] = (u3).all[1];            \
			w_[2] = (u3).all[2];            \
			w_[3] = (u3).all[3];            \
		}                                       \
		__builtin_memcpy(a, w_, 16);            \
	} while (0)

/* The packet's flow in the other direction's tuple (index d, a constant: CO-RE) gives what
 * the packet becomes: from where the other direction goes, to where it comes from. */
#define CT_TRANSLATE(n, ct, d)                                          \
	do {                                                            \
		CT_ADDR((n)->saddr, (ct)->tuplehash[d].tuple.dst.u3);   \
		CT_ADDR((n)->daddr, (ct)->tuplehash[d].tuple.src.u3);   \
		(n)->sport = (ct)->tuplehash[d].tuple.dst.u.all;        \
		(n)->dport = (ct)->tuplehash[d].tuple.src.u.all;        \
	} while (0)

/* translation asks conntrack about a TCP packet's flow and fills n: carried if the flow is
 * NAT-ed by this node and offloaded by the flowtable, with what the packet becomes. */
static __always_inline void translation(struct __sk_buff *skb, struct flow *f, struct nat_flow *n)
{
	struct bpf_ct_opts opts = {.netns_id = -1 /* BPF_F_CURRENT_NETNS */, .l4proto = IPPROTO_TCP};
	struct bpf_sock_tuple t = {};
	struct nf_conn *ct;
	unsigned long st;
	__u32 tsz = tuple(f, &t), a[4];

	if (!conntrack_kfuncs)
		return;
	ct = bpf_skb_ct_lookup(skb, &t, tsz, &opts, CT_OPTS_SZ);
	if (!ct)
		return;
	st = ct->status;
	if ((st & (IPS_SRC_NAT | IPS_DST_NAT)) && (st & (IPS_CONFIRMED | IPS_OFFLOAD)) == (IPS_CONFIRMED | IPS_OFFLOAD) &&
	    !(st & (IPS_DYING | IPS_HELPER))) {
		/* The packet goes the original way if its source is the original tuple's (a
		 * source address and port: the two directions' sources differ in one of them,
		 * or the flow would not be NAT-ed). */
		__builtin_memcpy(a, f->src.addr, 16);
		if (ct->tuplehash[0].tuple.src.u.all == f->src.port && ct->tuplehash[0].tuple.src.u3.all[0] == a[0] &&
		    (!f->v6 || (ct->tuplehash[0].tuple.src.u3.all[1] == a[1] && ct->tuplehash[0].tuple.src.u3.all[2] == a[2] &&
				ct->tuplehash[0].tuple.src.u3.all[3] == a[3])))
			CT_TRANSLATE(n, ct, 1);
		else
			CT_TRANSLATE(n, ct, 0);
		n->carry = 1;
	}
	bpf_ct_release(ct);
}

/* fold32 folds a one's complement sum into 32 bits. */
static __always_inline __u32 fold32(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	return (__u32)s;
}

/* fold16 folds a one's complement sum into 16 bits. */
static __always_inline __u16 fold16(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/* csum_add adds two one's complement sums of 32 bits (the end-around carry kept). */
static __always_inline __u32 csum_add(__u32 a, __u32 b)
{
	__u32 s = a + b;

	return s + (s < a);
}

/* HOP6_CSUM is what hop_limit-- adds to a packet's one's complement sum: the big-endian word
 * nexthdr|hop_limit less one (0xfffe), as the kernel keeps the sum in memory order. */
#define HOP6_CSUM ((__u32)bpf_htons(0xfffe))

/* IPv6 has no header checksum, so every change to its header changes the packet's sum, which
 * the kernel keeps in skb->csum where the device gave it (CHECKSUM_COMPLETE: many NICs, and
 * the software's validation of a tunnel's outer checksum). The program's direct writes do not
 * update it: sum6 adds their change (bpf_csum_update touches skb->csum only where it is
 * CHECKSUM_COMPLETE). A stale sum makes the receiver's validation fail and checksum the whole
 * packet again in software, with a "hw csum failure" report per packet where a NIC gave it.
 * IPv4 needs none: its header checksum cancels the header's changes. */
static __always_inline void sum6(struct __sk_buff *skb, __u32 diff)
{
	bpf_csum_update(skb, diff);
}

/* replaced adds the change of n 32-bit words (~old + new) to sum, and reports a change. */
static __always_inline bool replaced(__u64 *sum, const __u8 *old, const __u8 *new, int words)
{
	__u32 o[4] = {}, w[4] = {};
	bool changed = false;
	int i;

	__builtin_memcpy(o, old, 16);
	__builtin_memcpy(w, new, 16);
#pragma unroll
	for (i = 0; i < 4; i++) {
		if (i < words && o[i] != w[i]) {
			*sum += (__u32)~o[i];
			*sum += w[i];
			changed = true;
		}
	}
	return changed;
}

/* diffs computes a carried flow's checksum changes (struct nat_flow), once per answer. */
static __always_inline void diffs(struct flow *f, struct nat_flow *n)
{
	__u64 a = 0, p = 0;
	__be16 op[2] = {f->src.port, f->dst.port}, np[2] = {n->sport, n->dport};
	__u32 o, w;
	bool changed;

	changed = replaced(&a, f->src.addr, n->saddr, f->v6 ? 4 : 1);
	changed |= replaced(&a, f->dst.addr, n->daddr, f->v6 ? 4 : 1);
	if (changed) {
		n->changes |= NAT_ADDRS;
		n->addr_diff = fold32(a);
	}
	__builtin_memcpy(&o, op, 4);
	__builtin_memcpy(&w, np, 4);
	if (o != w) {
		p = (__u64)(__u32)~o + w;
		n->changes |= NAT_PORTS;
		n->port_diff = fold32(p);
	}
}

/* carried reports whether a TCP packet's flow is carried (translation), from the kept answer
 * while it is fresh, and fills n with what the packet becomes. SYN, FIN and RST take the
 * stack and void the kept answer. */
static __always_inline struct nat_flow *carried(struct __sk_buff *skb, struct flow *f)
{
	struct nat_key k = {.src = f->src, .dst = f->dst};
	__u64 now = bpf_ktime_get_coarse_ns();
	struct nat_flow *v = bpf_map_lookup_elem(&nat_flows, &k), n = {};

	if (f->tcpflags & (TCP_SYN | TCP_FIN | TCP_RST)) {
		if (v)
			bpf_map_delete_elem(&nat_flows, &k);
		return NULL;
	}
	if (v && now - v->asked < HANDED_TTL_NS)
		return v->carry ? v : NULL;
	n.asked = now;
	translation(skb, f, &n);
	if (n.carry)
		diffs(f, &n);
	bpf_map_update_elem(&nat_flows, &k, &n, BPF_ANY);
	return n.carry ? bpf_map_lookup_elem(&nat_flows, &k) : NULL;
}

/* nat_reply reports whether conntrack knows the flow of a packet to a remembered client end h
 * as NAT-ed: from the kept answer while it is fresh and about the same server end, else from
 * conntrack (and kept). */
static __always_inline bool nat_reply(struct __sk_buff *skb, struct flow *f, struct handed_end *h)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct handed_end n = {.asked = now, .port = f->src.port};

	if (h->asked && now - h->asked < HANDED_TTL_NS && h->port == f->src.port &&
	    same_addr(h->server, f->src.addr))
		return h->nat;
	n.nat = natted_flow(skb, f);
	__builtin_memcpy(n.server, f->src.addr, 16);
	bpf_map_update_elem(&handed, &f->dst, &n, BPF_EXIST);
	return n.nat;
}

/* direct_slot returns this CPU's direct_flows slot for the packet's flow (struct flow starts
 * with its two ends, laid out as struct nat_key). */
static __always_inline struct direct_flow *direct_slot(struct flow *f)
{
	__u32 i = words_hash((__u32 *)f, sizeof(struct nat_key) / 4) & (DIRECT_FLOWS - 1);

	return bpf_map_lookup_elem(&direct_flows, &i);
}

/* known_direct reports whether conntrack said, within HANDED_TTL_NS, that the packet's flow
 * (to an end not in handed) is not NAT-ed (direct_flows). */
static __always_inline bool known_direct(struct flow *f)
{
	struct direct_flow *d = direct_slot(f);
	__u32 *x, *y = (__u32 *)f, diff = 0;
	int i;

	if (!d)
		return false;
	x = (__u32 *)&d->k;
#pragma unroll
	for (i = 0; i < sizeof(struct nat_key) / 4; i++)
		diff |= x[i] ^ y[i];
	return !diff && bpf_ktime_get_coarse_ns() - d->asked < HANDED_TTL_NS;
}

/* note_direct keeps conntrack's answer that the packet's flow is not NAT-ed (direct_flows). */
static __always_inline void note_direct(struct flow *f)
{
	struct direct_flow *d = direct_slot(f);

	if (d) {
		__builtin_memcpy(&d->k, f, sizeof(d->k));
		d->asked = bpf_ktime_get_coarse_ns();
	}
}

/* handed_nat reports whether a packet to a client end the program handed to the stack is of
 * a flow conntrack knows as NAT-ed (nat_reply). An end with a mark of the current epochs but no
 * entry was forgotten by the LRU (more client ends were used since) or shares its mark with a
 * handed end: conntrack is asked (once per flow and HANDED_TTL_NS), and only a NAT-ed flow's
 * end is entered again (with the answer), so that its replies keep their un-NAT; a flow that is
 * not NAT-ed goes into direct_flows, and its end stays out of handed (an end that only shares a
 * mark, such as a pod-to-pod server's, would otherwise ask at every packet from alternating
 * clients, nat_reply keeping one server end's answer). */
static __always_inline bool handed_nat(struct __sk_buff *skb, struct settings *cfg, struct flow *f)
{
	struct handed_end *h, n = {.port = f->src.port, .nat = 1};

	if (!marked(cfg, &f->dst))
		return false;
	if ((h = bpf_map_lookup_elem(&handed, &f->dst)))
		return nat_reply(skb, f, h);
	if (known_direct(f))
		return false;
	if (!natted_flow(skb, f)) {
		note_direct(f);
		return false;
	}
	n.asked = bpf_ktime_get_coarse_ns();
	__builtin_memcpy(n.server, f->src.addr, 16);
	bpf_map_update_elem(&handed, &f->dst, &n, BPF_NOEXIST);
	return true;
}

/* roles looks an address up in its family's trie (an lpm6 key serves both: the IPv4 trie
 * reads only its prefix length and first 4 bytes). */
static __always_inline struct addr *roles(struct flow *f, struct endpoint *e)
{
	struct lpm6 key = {.prefixlen = f->v6 ? 128 : 32};

	__builtin_memcpy(key.addr, e->addr, 16);
	return bpf_map_lookup_elem(f->v6 ? (void *)&addrs6 : (void *)&addrs4, &key);
}

/* serves is the role a packet's destination must have for a device of role: a peer (Pod or
 * node) on a gateway (or a local Pod, where local-pod-to-pod is on), a local Pod on a
 * transport. */
static __always_inline __u32 serves(__u32 role, __u32 classes)
{
	if (role != ROLE_GATEWAY)
		return ADDR_LOCAL_POD;
	if (classes & (1U << CLASS_LOCAL_POD_TO_POD))
		return ADDR_PEER_POD | ADDR_PEER_NODE | ADDR_LOCAL_POD;
	return ADDR_PEER_POD | ADDR_PEER_NODE;
}

/* nat_checked reports whether the NAT check runs for a packet to an address with flags df
 * arriving on a device of role. A local Pod's packet to another local Pod may be a backend's
 * reply to a ClusterIP or NodePort connection from a Pod of this node: it comes from the Pods
 * and goes toward them, so either setting of the check covers it. */
static __always_inline bool nat_checked(struct settings *cfg, __u32 role, __u32 df)
{
	if (local_class(role, df, cfg->classes))
		return cfg->nat_check != 0;
	return check_nat(cfg, role);
}

/* CARRY: decide's answer for a packet of a carried NAT-ed flow (struct nat_flow). */
#define CARRY NUM_CLASSES

/* carry reports whether the packet is one of a carried flow, with its entry in *n. */
static __always_inline bool carry(struct __sk_buff *skb, struct settings *cfg, struct flow *f,
				  struct nat_flow **n)
{
	return (cfg->flags & SETTINGS_NAT_CARRY) && f->src.proto == IPPROTO_TCP && f->hops > 1 &&
	       (*n = carried(skb, f));
}

/* decide returns the class of a packet to redirect, with the agent's route for it in
 * *egress, CARRY with n filled, or -1 to hand it to the stack. The destination is looked up
 * first: most packets that are not ours (to a ClusterIP, a NodePort, the node) leave after
 * that one lookup, or, where NAT-ed flows are carried, after a second one for their TCP
 * packets. */
static __always_inline int decide(struct __sk_buff *skb, struct iface *in, struct settings *cfg,
				  struct flow *f, __u32 *egress, __u32 *dflags, struct nat_flow **n)
{
	struct addr *s, *d;
	int class;

	d = roles(f, &f->dst);
	if (!d || !(d->flags & serves(in->role, cfg->classes)) || (d->flags & ADDR_NODE)) {
		/* To an address of no class (a ClusterIP, the node): the stack may NAT it, and its
		 * replies come back on a device of the other role (or, from a backend Pod of this
		 * node, on a gateway: nat_checked() checks those whenever any check is on, and
		 * every setting that has one checks toward the Pods). Of a TCP connection only the
		 * SYN is remembered (every reply's lookup keeps the entry fresh). */
		if (f->opens && check_nat(cfg, in->role == ROLE_GATEWAY ? ROLE_TRANSPORT : ROLE_GATEWAY) &&
		    (s = roles(f, &f->src)) && sender(in->role, s->flags))
			remember(cfg, &f->src, f->src.proto == IPPROTO_TCP);
		else if (!f->opens && carry(skb, cfg, f, n))
			return CARRY;
		return -1;
	}
	/* A reply to a client end the program handed to the stack: if conntrack knows its flow
	 * as NAT-ed, the stack un-NATs it, whatever else the packet is. */
	if (nat_checked(cfg, in->role, d->flags) && handed_nat(skb, cfg, f)) {
		if (carry(skb, cfg, f, n))
			return CARRY;
		count(STAT_NAT, skb);
		return -1;
	}
	if (!(s = roles(f, &f->src)) || (class = classify(in->role, s->flags, d->flags, cfg->classes)) < 0)
		return -1;
	if (!(cfg->classes & (1U << class)))
		return -1;
	if ((s->flags | d->flags) & ADDR_EXCLUDE) {
		count(STAT_EXCLUDED, skb);
		return -1;
	}
	if (f->hops <= 1) {
		count(STAT_TTL, skb);
		return -1;
	}
	*egress = d->egress;
	*dflags = d->flags;
	return class;
}

/* hop4 decrements an IPv4 header's TTL, with its checksum changed by the difference (RFC
 * 1624). */
static __always_inline void hop4(struct iphdr *ip)
{
	__u32 sum = ip->check + bpf_htons(0x0100);

	ip->check = (__u16)(sum + (sum >= 0xffff));
	ip->ttl--;
}

/* hop decrements the TTL (hop4) or the hop limit, as a router does; false if the headers are
 * out of reach. */
static __always_inline bool hop(struct __sk_buff *skb, bool v6)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	struct iphdr *ip = data + ETH_HLEN;

	if (v6) {
		if ((void *)(ip6 + 1) > end)
			return false;
		ip6->hop_limit--;
		sum6(skb, HOP6_CSUM);
		return true;
	}
	if ((void *)(ip + 1) > end)
		return false;
	hop4(ip);
	return true;
}

/* PSEUDO6: bpf_l4_csum_replace with BPF_F_PSEUDO_HDR takes the addresses' change off a
 * CHECKSUM_COMPLETE skb->csum, as IPv4 needs (its header checksum cancels the header's part of
 * the change, the TCP checksum's change is left). For IPv6 the addresses' change is in the sum
 * as well (no header checksum), so nothing changes in all: the change is added back (sum6).
 * Linux 6.16's BPF_F_IPV6 does the same in the helper, but older kernels refuse the flag. */

/* translate rewrites a carried packet's addresses and ports to n's in place, IPv4's header
 * checksum by the addresses' change (RFC 1624), and TCP's by a helper that knows how the
 * kernel holds it (a CHECKSUM_PARTIAL packet's pseudo-header sum takes the addresses only):
 * at most two helper calls. */
static __always_inline int translate(struct __sk_buff *skb, struct flow *f, struct nat_flow *n)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u32 l4 = ETH_HLEN + (f->v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 *ports;
	__u32 s;

	if (f->v6) {
		ports = (void *)(ip6 + 1);
		if ((void *)(ports + 2) > end)
			return -1;
		__builtin_memcpy(&ip6->saddr, n->saddr, 16);
		__builtin_memcpy(&ip6->daddr, n->daddr, 16);
	} else {
		ports = (void *)(ip + 1);
		if ((void *)(ports + 2) > end)
			return -1;
		__builtin_memcpy(&ip->saddr, n->saddr, 4);
		__builtin_memcpy(&ip->daddr, n->daddr, 4);
		if (n->changes & NAT_ADDRS) {
			s = (__u16)~ip->check + fold16(n->addr_diff);
			ip->check = (__u16)~fold16(s);
		}
	}
	ports[0] = n->sport;
	ports[1] = n->dport;
	if ((n->changes & NAT_ADDRS) && bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, n->addr_diff, BPF_F_PSEUDO_HDR))
		return -1;
	if ((n->changes & NAT_PORTS) && bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, n->port_diff, 0))
		return -1;
	if (f->v6 && (n->changes & NAT_ADDRS))
		sum6(skb, n->addr_diff); /* see PSEUDO6 */
	return 0;
}

/* pair_bit returns the word of pair_bits for hash h and its bit in *bit. */
static __always_inline __u64 *pair_bit(__u32 h, __u64 *bit)
{
	__u32 i = (h >> 6) & (PAIR_BITS_WORDS - 1);

	*bit = 1ULL << (h & 63);
	return bpf_map_lookup_elem(&pair_bits, &i);
}

/* slot_way fills w with pair p's way for a packet of flow f: false where it cannot be kept
 * (no jiffy known, or its next hop is about to expire). */
static __always_inline bool slot_way(struct slot_way *w, struct settings *cfg, struct flow *f,
				     struct pair *p)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	__u32 tick = cfg->tick_ns;

	if (!tick || p->nh.expires <= now || p->class >= NUM_CLASSES)
		return false;
	/* valid while jiffies < until: at most the next hop's time left */
	w->until = bpf_jiffies64() + (p->nh.expires - now) / tick;
	w->generation = f->gen;
	w->ifindex = p->nh.ifindex;
	w->mtu = p->nh.mtu;
	w->stat = STAT_EXPRESS_CLASS + p->class * 2 + f->v6;
	w->flags = p->nh.flags & IFACE_MTU6_LOWER ? SLOT_GSO_STACK : 0;
	if (p->nh.flags & IFACE_PEER) {
		w->stat += NUM_CLASSES * 2;
		w->flags |= SLOT_PEER;
	}
	if (nat_checked(cfg, p->role, p->dflags))
		w->flags |= SLOT_NAT_CHECKED;
	__builtin_memcpy(w->dmac, p->nh.dmac, ETH_ALEN);
	__builtin_memcpy(w->smac, p->nh.smac, ETH_ALEN);
	return true;
}

/* fill_slot puts pair p, of key k4 or k6 (the packet's family's, pair_keys) and hash h, in this
 * CPU's express lane. */
static __always_inline void fill_slot(struct settings *cfg, struct flow *f, struct pair *p,
				      struct pair_key4 *k4, struct pair_key6 *k6, __u32 h)
{
	__u32 i = h & slot_mask;
	struct slot4 *s4;
	struct slot6 *s6;

	if (f->v6) {
		if ((s6 = bpf_map_lookup_elem(&slots6, &i)) && slot_way(&s6->w, cfg, f, p))
			s6->k = *k6;
	} else if ((s4 = bpf_map_lookup_elem(&slots4, &i)) && slot_way(&s4->w, cfg, f, p)) {
		s4->k = *k4;
	}
}

/* pair_keys fills the pair key of the packet's family (k4 or k6) and returns its hash. */
static __always_inline __u32 pair_keys(struct __sk_buff *skb, struct flow *f, struct pair_key4 *k4,
				       struct pair_key6 *k6)
{
	if (f->v6) {
		__builtin_memcpy(k6->src, f->src.addr, 16);
		__builtin_memcpy(k6->dst, f->dst.addr, 16);
		k6->ingress = skb->ingress_ifindex;
		return words_hash((__u32 *)k6, sizeof(*k6) / 4);
	}
	__builtin_memcpy(k4->src, f->src.addr, 4);
	__builtin_memcpy(k4->dst, f->dst.addr, 4);
	k4->ingress = skb->ingress_ifindex;
	return words_hash((__u32 *)k4, sizeof(*k4) / 4);
}

/* keep_pair keeps what was decided for the packet's pair of addresses on its device, with the
 * next hop nh, as of the packet's generation. */
static __always_inline void keep_pair(struct __sk_buff *skb, struct settings *cfg, struct flow *f,
				      int class, __u32 dflags, struct nexthop *nh)
{
	struct pair p = {.nh = *nh, .class = class, .dflags = dflags, .role = f->role};
	struct pair_key4 k4 = {};
	struct pair_key6 k6 = {};
	__u64 bit, *word;
	__u32 h;

	if (!f->keep)
		return;
	p.nh.generation = f->gen;
	h = pair_keys(skb, f, &k4, &k6);
	if (f->v6 ? bpf_map_update_elem(&pairs6, &k6, &p, BPF_ANY) : bpf_map_update_elem(&pairs4, &k4, &p, BPF_ANY))
		return;
	fill_slot(cfg, f, &p, &k4, &k6, h);
	if ((word = pair_bit(h, &bit)) && !(*word & bit))
		__sync_fetch_and_or(word, bit);
}

/* keep stores the FIB's answer for the packet's destination, and the pair's decision. */
static __always_inline void keep(struct __sk_buff *skb, struct settings *cfg, struct nexthop_key *k,
				 struct bpf_fib_lookup *fib, struct iface *out, struct flow *f, int class,
				 __u32 dflags)
{
	struct nexthop nh = {.expires = bpf_ktime_get_coarse_ns() + NEXTHOP_TTL_NS};

	if (!(cfg->flags & SETTINGS_NEXTHOP_CACHE) || (dflags & ADDR_NO_KEEP))
		return;
	answer(&nh, f->gen, fib, out);
	if (!(dflags & ADDR_PAIR_ONLY))
		bpf_map_update_elem(&nexthops, k, &nh, BPF_ANY);
	keep_pair(skb, cfg, f, class, dflags, &nh);
}

/* kept_pair returns the packet's pair if it holds: of the packet's generation, unexpired, its
 * class on, the packet fits its device and has hops left, and it is no reply to an end handed
 * to the stack (decide() asks conntrack about those); else NULL: the full way. */
static __always_inline struct pair *kept_pair(struct __sk_buff *skb, struct settings *cfg,
					      struct flow *f, __u16 tot_len)
{
	struct pair_key4 k4 = {};
	struct pair_key6 k6 = {};
	__u64 bit, *word;
	struct pair *p;
	__u32 h;

	if (!(cfg->flags & SETTINGS_NEXTHOP_CACHE) || f->hops <= 1)
		return NULL;
	h = pair_keys(skb, f, &k4, &k6);
	if (!(word = pair_bit(h, &bit)) || !(*word & bit))
		goto none;
	p = f->v6 ? bpf_map_lookup_elem(&pairs6, &k6) : bpf_map_lookup_elem(&pairs4, &k4);
	if (!p || p->nh.generation != f->gen || bpf_ktime_get_coarse_ns() > p->nh.expires)
		goto none;
	/* A valid pair that does not answer this packet stays as it is. */
	if (p->class >= NUM_CLASSES || !(cfg->classes & (1U << p->class)) || !usable(skb, cfg, &p->nh, tot_len))
		return NULL;
	/* An end whose mark counts: one in handed goes the full way (nat_reply), and so does one
	 * not in handed until conntrack said its flow is direct (handed_nat): the LRU may have
	 * forgotten a NAT-ed client end whose two addresses also have a direct flow. */
	if (nat_checked(cfg, p->role, p->dflags) && marked(cfg, &f->dst) &&
	    (bpf_map_lookup_elem(&handed, &f->dst) || !known_direct(f)))
		return NULL;
	/* this CPU's next packets of the pair take the express lane */
	fill_slot(cfg, f, p, &k4, &k6, h);
	return p;
none:
	f->keep = 1;
	return NULL;
}

/* nat_way fills w with the way of carried flow n, sent by its kept answer, for what is left of
 * n's time: false where it cannot be kept (no jiffy known, the answer about to expire, or of
 * another generation than the packet's). */
static __always_inline bool nat_way(struct slot_way *w, struct settings *cfg, struct flow *f,
				    struct nat_flow *n)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	__u32 tick = cfg->tick_ns;

	if (!tick || now - n->asked >= HANDED_TTL_NS || n->nh.generation != f->gen)
		return false;
	/* valid while jiffies < until: at most what is left of conntrack's answer */
	w->until = bpf_jiffies64() + (n->asked + HANDED_TTL_NS - now) / tick;
	w->generation = f->gen;
	w->ifindex = n->nh.ifindex;
	w->mtu = n->nh.mtu;
	w->stat = STAT_NAT_EXPRESS;
	w->flags = n->nh.flags & IFACE_MTU6_LOWER ? SLOT_GSO_STACK : 0;
	if (n->nh.flags & IFACE_PEER) {
		w->stat++;
		w->flags |= SLOT_PEER;
	}
	__builtin_memcpy(w->dmac, n->nh.dmac, ETH_ALEN);
	__builtin_memcpy(w->smac, n->nh.smac, ETH_ALEN);
	return true;
}

/* NAT_SLOT_CHANGES sets what a NAT slot s (either family's) keeps of carried flow n besides its
 * addresses: the ports, the checksums' changes, and the flow's nat_voids word. */
#define NAT_SLOT_CHANGES(s, n, voids)              \
	do {                                       \
		(s)->nsport = (n)->sport;          \
		(s)->ndport = (n)->dport;          \
		(s)->addr_diff = (n)->addr_diff;   \
		(s)->port_diff = (n)->port_diff;   \
		(s)->changes = (n)->changes;       \
		(s)->voided = (voids);             \
	} while (0)

/* flow_nat_hash is nat_hash4 / nat_hash6 of flow f, from the addresses and ports it was
 * built from (the packet's, as it arrived). */
static __always_inline __u32 flow_nat_hash(struct flow *f)
{
	__be16 p[2] = {f->src.port, f->dst.port};
	__u32 ports, a, b;

	__builtin_memcpy(&ports, p, 4);
	if (f->v6)
		return nat_hash6(f->src.addr, f->dst.addr, ports);
	__builtin_memcpy(&a, f->src.addr, 4);
	__builtin_memcpy(&b, f->dst.addr, 4);
	return nat_hash4(a, b, ports);
}

/* fill_nat_slot puts carried flow f, translated and sent as n says (by its kept answer), in
 * this CPU's NAT express lane. */
static __always_inline void fill_nat_slot(struct __sk_buff *skb, struct settings *cfg, struct flow *f,
					  struct nat_flow *n)
{
	__u32 h = flow_nat_hash(f), i = h & slot_mask, *v;
	struct nat_slot4 *s4;
	struct nat_slot6 *s6;

	if (!(v = nat_void(h)))
		return;
	if (f->v6) {
		if (!(s6 = bpf_map_lookup_elem(&nat_slots6, &i)) || !nat_way(&s6->w, cfg, f, n))
			return;
		__builtin_memcpy(s6->saddr, f->src.addr, 16);
		__builtin_memcpy(s6->daddr, f->dst.addr, 16);
		s6->sport = f->src.port;
		s6->dport = f->dst.port;
		s6->ingress = skb->ingress_ifindex;
		__builtin_memcpy(s6->nsaddr, n->saddr, 16);
		__builtin_memcpy(s6->ndaddr, n->daddr, 16);
		NAT_SLOT_CHANGES(s6, n, *v);
		return;
	}
	if (!(s4 = bpf_map_lookup_elem(&nat_slots4, &i)) || !nat_way(&s4->w, cfg, f, n))
		return;
	__builtin_memcpy(&s4->saddr, f->src.addr, 4);
	__builtin_memcpy(&s4->daddr, f->dst.addr, 4);
	s4->sport = f->src.port;
	s4->dport = f->dst.port;
	s4->ingress = skb->ingress_ifindex;
	__builtin_memcpy(&s4->nsaddr, n->saddr, 4);
	__builtin_memcpy(&s4->ndaddr, n->daddr, 4);
	NAT_SLOT_CHANGES(s4, n, *v);
}

/* unslot voids the NAT express lane's slots of a TCP packet's flow f (on every CPU) if the
 * packet has SYN, FIN or RST: conntrack sees the change of state, and the flow's packets that
 * follow ask it again (as carried() does). */
static __always_inline void unslot(struct flow *f)
{
	__u32 *v;

	if ((f->tcpflags & (TCP_SYN | TCP_FIN | TCP_RST)) && (v = nat_void(flow_nat_hash(f))))
		__sync_fetch_and_add(v, 1);
}

/* by_pair sends a packet as its pair says. */
static __always_inline int by_pair(struct __sk_buff *skb, struct flow *f, struct pair *p)
{
	if (!hop(skb, f->v6))
		return PASS;
	count(p->class * 2 + f->v6, skb);
	return emit(skb, p->nh.dmac, p->nh.smac, p->nh.ifindex, p->nh.flags);
}

/* forward routes a packet decide() took: by the kept next hop, else by the FIB. */
static __always_inline int forward(struct __sk_buff *skb, struct settings *cfg, struct flow *f,
				   int class, __u32 dflags, struct bpf_fib_lookup *fib, __u32 egress,
				   struct nat_flow *n)
{
	struct nexthop_key k = {.ingress = skb->ingress_ifindex};
	struct nexthop *nh;
	struct iface *out;
	long how = 0;

	if (class == CARRY) {
		/* the flow's own kept answer, until its next conntrack answer (no expiry of its own) */
		nh = &n->nh;
		if (!(cfg->flags & SETTINGS_NEXTHOP_CACHE) || !nh->ifindex || !usable(skb, cfg, nh, fib->tot_len))
			nh = NULL;
	} else {
		__builtin_memcpy(k.addr, f->dst.addr, 16);
		nh = dflags & ADDR_PAIR_ONLY ? NULL : cached(skb, cfg, &k, fib->tot_len);
	}
	if (nh) {
		if (class == CARRY && translate(skb, f, n))
			return TC_ACT_SHOT; /* half rewritten: cannot be handed on */
		if (!hop(skb, f->v6))
			return PASS;
		count(class == CARRY ? STAT_NAT_CARRIED : class * 2 + f->v6, skb);
		if (class != CARRY)
			keep_pair(skb, cfg, f, class, dflags, nh);
		else
			fill_nat_slot(skb, cfg, f, n);
		return emit(skb, nh->dmac, nh->smac, nh->ifindex, nh->flags);
	}
	if (!(out = route(skb, fib, egress, &how)))
		return PASS;
	if (how == BPF_FIB_LKUP_RET_SUCCESS && class == CARRY)
		answer(&n->nh, f->gen, fib, out);
	else if (how == BPF_FIB_LKUP_RET_SUCCESS)
		keep(skb, cfg, &k, fib, out, f, class, dflags);
	if (class == CARRY && translate(skb, f, n))
		return TC_ACT_SHOT;
	if (!hop(skb, f->v6))
		return PASS;
	count(class == CARRY ? STAT_NAT_CARRIED : class * 2 + f->v6, skb);
	return finish(skb, fib, out, how);
}

static __always_inline int forward4(struct __sk_buff *skb, struct settings *cfg)
{
	__u32 key = skb->ingress_ifindex;
	struct iface *in;
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	struct bpf_fib_lookup fib = {};
	struct nat_flow *n = NULL;
	struct flow f = {.gen = *(volatile __u32 *)&cfg->generation};
	__u32 egress = 0, dflags = 0;
	struct pair *p;
	__be16 *ports;
	int class;

	ports = (void *)(ip + 1);
	if ((void *)(ports + 2) > end || *(__u8 *)ip != 0x45 /* version 4, IHL 5 */)
		return PASS;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return PASS;
	if (ip->frag_off & bpf_htons(0x3fff)) /* fragments: no ports to match on */
		return PASS;
	__builtin_memcpy(f.src.addr, &ip->saddr, 4);
	__builtin_memcpy(f.dst.addr, &ip->daddr, 4);
	f.src.port = ports[0];
	f.dst.port = ports[1];
	f.src.proto = f.dst.proto = ip->protocol;
	f.hops = ip->ttl;
	f.tcpflags = tcp_flags(ip->protocol, (void *)ports, end);
	if (ip->protocol == IPPROTO_TCP && (cfg->flags & SETTINGS_NAT_CARRY))
		unslot(&f);
	if ((p = kept_pair(skb, cfg, &f, skb->gso_size ? 0 : bpf_ntohs(ip->tot_len))))
		return by_pair(skb, &f, p);
	if (!(in = bpf_map_lookup_elem(&ifaces, &key)))
		return PASS;
	f.role = in->role;
	f.opens = opens(f.tcpflags);
	if ((class = decide(skb, in, cfg, &f, &egress, &dflags, &n)) < 0)
		return PASS;

	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.tot_len = skb->gso_size ? 0 : bpf_ntohs(ip->tot_len);
	fib.ipv4_src = ip->saddr;
	fib.ipv4_dst = ip->daddr;
	/* the ports too: the kernel's ECMP hash (fib_multipath_hash_policy 1) takes them */
	fib.sport = f.src.port;
	fib.dport = f.dst.port;
	if (class == CARRY) {
		if (!n)
			return PASS;
		__builtin_memcpy(&fib.ipv4_src, n->saddr, 4);
		__builtin_memcpy(&fib.ipv4_dst, n->daddr, 4);
		fib.sport = n->sport;
		fib.dport = n->dport;
	}
	fib.ifindex = skb->ingress_ifindex;
	return forward(skb, cfg, &f, class, dflags, &fib, egress, n);
}

static __always_inline int forward6(struct __sk_buff *skb, struct settings *cfg)
{
	__u32 key = skb->ingress_ifindex;
	struct iface *in;
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	struct bpf_fib_lookup fib = {};
	struct flow f = {.v6 = 1, .gen = *(volatile __u32 *)&cfg->generation};
	struct nat_flow *n = NULL;
	__u32 egress = 0, dflags = 0;
	struct pair *p;
	__be16 *ports;
	int class;

	ports = (void *)(ip6 + 1);
	if ((void *)(ports + 2) > end || ip6->version != 6)
		return PASS;
	/* Extension headers (fragments included) take the normal path. */
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP)
		return PASS;
	__builtin_memcpy(f.src.addr, &ip6->saddr, 16);
	__builtin_memcpy(f.dst.addr, &ip6->daddr, 16);
	f.src.port = ports[0];
	f.dst.port = ports[1];
	f.src.proto = f.dst.proto = ip6->nexthdr;
	f.hops = ip6->hop_limit;
	f.tcpflags = tcp_flags(ip6->nexthdr, (void *)ports, end);
	if (ip6->nexthdr == IPPROTO_TCP && (cfg->flags & SETTINGS_NAT_CARRY))
		unslot(&f);
	if ((p = kept_pair(skb, cfg, &f, skb->gso_size ? 0 : sizeof(*ip6) + bpf_ntohs(ip6->payload_len))))
		return by_pair(skb, &f, p);
	if (!(in = bpf_map_lookup_elem(&ifaces, &key)))
		return PASS;
	f.role = in->role;
	f.opens = opens(f.tcpflags);
	if ((class = decide(skb, in, cfg, &f, &egress, &dflags, &n)) < 0)
		return PASS;

	fib.family = AF_INET6;
	fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0fffffff);
	fib.l4_protocol = ip6->nexthdr;
	fib.tot_len = skb->gso_size ? 0 : sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	if (class == CARRY && !n)
		return PASS;
	__builtin_memcpy(fib.ipv6_src, class == CARRY ? (void *)n->saddr : (void *)&ip6->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, class == CARRY ? (void *)n->daddr : (void *)&ip6->daddr, 16);
	fib.sport = class == CARRY ? n->sport : f.src.port; /* for the ECMP hash, as above */
	fib.dport = class == CARRY ? n->dport : f.dst.port;
	fib.ifindex = skb->ingress_ifindex;
	return forward(skb, cfg, &f, class, dflags, &fib, egress, n);
}

/* EXPRESS_MISS: the express lane cannot send the packet; it is untouched. */
#define EXPRESS_MISS (-100)

/* express sends a packet its slot's way w allows (the caller checked it as kept_pair checks a
 * kept pair: the generation, the expiry, the hops, the size, the NAT check). */
static __always_inline int express(struct __sk_buff *skb, struct slot_way *w, struct ethhdr *eth)
{
	count(w->stat, skb);
	/* Both MACs, as the header holds them, in one 8-byte and one 4-byte copy instead of twelve
	 * byte copies: the slot's are 8-aligned and in the header's order (below); the packet's
	 * stores need no alignment on the architectures the program is built for (x86-64 and
	 * arm64 have efficient unaligned access, which the verifier checks). */
	void *macs = (void *)w + offsetof(struct slot_way, dmac);

	*(__u64 *)eth = *(__u64 *)macs;
	*(__u32 *)((void *)eth + 8) = *(__u32 *)(macs + 8);
	if (w->flags & SLOT_PEER)
		return bpf_redirect_peer(w->ifindex, 0);
	return bpf_redirect(w->ifindex, 0);
}

/* slot_holds reports whether slot way w may send a packet of IP length len (0 where the header
 * does not say: BIG TCP), as kept_pair checks a kept pair: of the current generation,
 * unexpired, and it fits: a packet whose length fits, or GSO segments that do. (The callers
 * check the hops first: passed in, they cost 10 instructions more per packet.) */
static __always_inline bool slot_holds(struct __sk_buff *skb, struct settings *cfg,
				       struct slot_way *w, __u32 len)
{
	if (w->generation != *(volatile __u32 *)&cfg->generation || bpf_jiffies64() >= w->until)
		return false;
	return len - 1 < w->mtu || (skb->gso_size && !(w->flags & SLOT_GSO_STACK) && fits(skb, w->ifindex));
}

/* handed4 reports whether the IPv4 end addr:port/proto has a mark of the current epochs in
 * handed_marks (or it is out of reach): handed_mark() of that end without building it. */
static __always_inline bool handed4(struct settings *cfg, __be32 addr, __be16 port, __u8 proto)
{
	__u64 *mark = handed_slot(mark_hash(addr, port, proto));

	return !mark || *mark >= *(volatile __u32 *)&cfg->handed_since;
}

/* same_key6 compares two IPv6 pair keys word by word. */
static __always_inline bool same_key6(struct pair_key6 *a, struct pair_key6 *b)
{
	__u32 *x = (__u32 *)a, *y = (__u32 *)b, diff = 0;
	int i;

#pragma unroll
	for (i = 0; i < sizeof(*a) / 4; i++)
		diff |= x[i] ^ y[i];
	return !diff;
}

static __always_inline int express4(struct __sk_buff *skb, struct settings *cfg)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 *ports = (void *)(ip + 1);
	__u32 saddr, daddr, ingress, i;
	struct slot4 *s;

	if ((void *)(ports + 2) > end || *(__u8 *)ip != 0x45 /* version 4, IHL 5 */ || (ip->frag_off & bpf_htons(0x3fff)))
		return EXPRESS_MISS;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return EXPRESS_MISS;
	saddr = ip->saddr;
	daddr = ip->daddr;
	ingress = skb->ingress_ifindex;
	/* words_hash of the pair's key (struct pair_key4: src, dst, ingress), from registers */
	i = hash_end(hash_step(hash_step(hash_step(HASH_SEED, saddr), daddr), ingress)) & slot_mask;
	if (!(s = bpf_map_lookup_elem(&slots4, &i)) || *(__u32 *)s->k.src != saddr ||
	    *(__u32 *)s->k.dst != daddr || s->k.ingress != ingress)
		return EXPRESS_MISS;
	if (ip->ttl <= 1 || !slot_holds(skb, cfg, &s->w, bpf_ntohs(ip->tot_len)))
		return EXPRESS_MISS;
	if ((s->w.flags & SLOT_NAT_CHECKED) && handed4(cfg, daddr, ports[1], ip->protocol))
		return EXPRESS_MISS;
	hop4(ip); /* on the header read above */
	return express(skb, &s->w, data);
}

/* nat_send finishes a packet of the NAT express lane whose addresses, ports and hops its slot
 * rewrote: TCP's checksum (at l4) by the slot's changes, as translate() does, then the slot's
 * way w. */
static __always_inline int nat_send(struct __sk_buff *skb, struct slot_way *w, __u8 changes, __u32 addr_diff,
				    __u32 port_diff, __u32 l4)
{
	void *data;

	if ((changes & NAT_ADDRS) && bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, addr_diff, BPF_F_PSEUDO_HDR))
		return TC_ACT_SHOT; /* half rewritten: cannot be handed on */
	if ((changes & NAT_PORTS) && bpf_l4_csum_replace(skb, l4 + TCP_CSUM_OFF, 0, port_diff, 0))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	if (data + ETH_HLEN > (void *)(long)skb->data_end)
		return TC_ACT_SHOT;
	return express(skb, w, data);
}

/* nat_express4 translates and sends an IPv4 packet of a carried flow as its NAT slot says
 * (struct nat_slot4), or misses untouched. */
static __always_inline int nat_express4(struct __sk_buff *skb, struct settings *cfg)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 *ports = (void *)(ip + 1);
	__u8 *l4 = (void *)ports;
	__u32 saddr, daddr, pw, h, i, sum, *v;
	struct nat_slot4 *s;

	if (!(cfg->flags & SETTINGS_NAT_CARRY))
		return EXPRESS_MISS;
	if ((void *)(l4 + TCP_CSUM_OFF + 2) > end || *(__u8 *)ip != 0x45 /* version 4, IHL 5 */ || (ip->frag_off & bpf_htons(0x3fff)) ||
	    ip->protocol != IPPROTO_TCP || (l4[TCP_FLAGS_OFF] & (TCP_SYN | TCP_FIN | TCP_RST)))
		return EXPRESS_MISS;
	saddr = ip->saddr;
	daddr = ip->daddr;
	pw = *(__u32 *)ports;
	h = nat_hash4(saddr, daddr, pw);
	i = h & slot_mask;
	if (!(s = bpf_map_lookup_elem(&nat_slots4, &i)) || s->saddr != saddr || s->daddr != daddr ||
	    *(__u32 *)&s->sport != pw || s->ingress != skb->ingress_ifindex)
		return EXPRESS_MISS;
	if (ip->ttl <= 1 || !slot_holds(skb, cfg, &s->w, bpf_ntohs(ip->tot_len)))
		return EXPRESS_MISS;
	if (!(v = nat_void(h)) || *v != s->voided)
		return EXPRESS_MISS;
	/* as translate() and hop() do */
	ip->saddr = s->nsaddr;
	ip->daddr = s->ndaddr;
	ports[0] = s->nsport;
	ports[1] = s->ndport;
	if (s->changes & NAT_ADDRS) {
		sum = (__u16)~ip->check + fold16(s->addr_diff);
		ip->check = (__u16)~fold16(sum);
	}
	hop4(ip);
	return nat_send(skb, &s->w, s->changes, s->addr_diff, s->port_diff, ETH_HLEN + sizeof(*ip));
}

/* nat_express6 is nat_express4 for IPv6 (no extension headers). */
static __always_inline int nat_express6(struct __sk_buff *skb, struct settings *cfg)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	__be16 *ports = (void *)(ip6 + 1);
	__u8 *l4 = (void *)ports;
	struct nat_slot6 *s;
	__u32 pw, h, i, *v;

	if (!(cfg->flags & SETTINGS_NAT_CARRY))
		return EXPRESS_MISS;
	if ((void *)(l4 + TCP_CSUM_OFF + 2) > end || ip6->version != 6 || ip6->nexthdr != IPPROTO_TCP ||
	    (l4[TCP_FLAGS_OFF] & (TCP_SYN | TCP_FIN | TCP_RST)))
		return EXPRESS_MISS;
	pw = *(__u32 *)ports;
	h = nat_hash6((__u8 *)&ip6->saddr, (__u8 *)&ip6->daddr, pw);
	i = h & slot_mask;
	if (!(s = bpf_map_lookup_elem(&nat_slots6, &i)) || *(__u32 *)&s->sport != pw ||
	    s->ingress != skb->ingress_ifindex || !same_addr(s->saddr, (__u8 *)&ip6->saddr) ||
	    !same_addr(s->daddr, (__u8 *)&ip6->daddr))
		return EXPRESS_MISS;
	/* payload_len 0: a BIG TCP packet, whose length is the buffer's */
	if (ip6->hop_limit <= 1 ||
	    !slot_holds(skb, cfg, &s->w, ip6->payload_len ? sizeof(*ip6) + bpf_ntohs(ip6->payload_len) : 0))
		return EXPRESS_MISS;
	if (!(v = nat_void(h)) || *v != s->voided)
		return EXPRESS_MISS;
	/* as translate() and hop() do */
	__builtin_memcpy(&ip6->saddr, s->nsaddr, 16);
	__builtin_memcpy(&ip6->daddr, s->ndaddr, 16);
	ports[0] = s->nsport;
	ports[1] = s->ndport;
	ip6->hop_limit--;
	sum6(skb, s->changes & NAT_ADDRS ? csum_add(s->addr_diff, HOP6_CSUM) : HOP6_CSUM); /* PSEUDO6 */
	return nat_send(skb, &s->w, s->changes, s->addr_diff, s->port_diff, ETH_HLEN + sizeof(*ip6));
}

static __always_inline int express6(struct __sk_buff *skb, struct settings *cfg)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	__be16 *ports = (void *)(ip6 + 1);
	struct endpoint dst = {};
	struct pair_key6 k;
	__u64 *mark;
	struct slot6 *s;
	__u32 i;

	if ((void *)(ports + 2) > end || ip6->version != 6)
		return EXPRESS_MISS;
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP)
		return EXPRESS_MISS;
	__builtin_memcpy(k.src, &ip6->saddr, 16);
	__builtin_memcpy(k.dst, &ip6->daddr, 16);
	k.ingress = skb->ingress_ifindex;
	i = words_hash((__u32 *)&k, sizeof(k) / 4) & slot_mask;
	if (!(s = bpf_map_lookup_elem(&slots6, &i)) || !same_key6(&s->k, &k))
		return EXPRESS_MISS;
	/* payload_len 0: a BIG TCP packet, whose length is the buffer's */
	if (ip6->hop_limit <= 1 ||
	    !slot_holds(skb, cfg, &s->w, ip6->payload_len ? sizeof(*ip6) + bpf_ntohs(ip6->payload_len) : 0))
		return EXPRESS_MISS;
	if (s->w.flags & SLOT_NAT_CHECKED) {
		__builtin_memcpy(dst.addr, &ip6->daddr, 16);
		dst.port = ports[1];
		dst.proto = ip6->nexthdr;
		if (!(mark = handed_mark(&dst)) || *mark >= *(volatile __u32 *)&cfg->handed_since)
			return EXPRESS_MISS;
	}
	ip6->hop_limit--;
	sum6(skb, HOP6_CSUM);
	return express(skb, &s->w, data);
}

SEC("tc")
int hostaccel_fp(struct __sk_buff *skb)
{
	struct settings *cfg = &agent_settings;
	int ret;

	/* Only frames addressed to this device, and not VLAN-tagged ones (they belong to a VLAN
	 * device on top of it). The device's role is looked up after the packet's pair (which
	 * holds it). */
	if (skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return PASS;
	if (!cfg->classes)
		return PASS;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if ((ret = express4(skb, cfg)) != EXPRESS_MISS || (ret = nat_express4(skb, cfg)) != EXPRESS_MISS)
			return ret;
		return forward4(skb, cfg);
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if ((ret = express6(skb, cfg)) != EXPRESS_MISS || (ret = nat_express6(skb, cfg)) != EXPRESS_MISS)
			return ret;
		return forward6(skb, cfg);
	}
	return PASS;
}

char _license[] SEC("license") = "GPL";
