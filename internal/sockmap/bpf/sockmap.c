//go:build ignore

// SPDX-License-Identifier: GPL-2.0
//
// hostaccel's sockmap datapath: TCP between two local Pods carried socket to socket.
//
// hostaccel_so (sock_ops, on the cgroup v2 root) enters every TCP socket that reaches
// ESTABLISHED (either side) into the sockhash when both its ends are local Pod addresses,
// not excluded, and not the same address (a Pod talking to itself, or any loopback address,
// is never entered). A Pod's address belongs to one network namespace on the node, so the
// 4-tuple of such a socket is unique on the node: it is the key.
//
// hostaccel_sm (sk_msg, attached to the sockhash) runs for each sendmsg/sendfile of a socket
// in the map: it looks up the peer socket (the reversed 4-tuple) and moves the message to the
// peer's receive queue (bpf_msg_redirect_hash, BPF_F_INGRESS), past both TCP/IP stacks. A
// peer that is not in the map (a connection through a Service DNAT, the peer entered by
// another sockmap user, the map full) leaves the message on the normal TCP path.
//
// IPv4 keys are written as IPv4-mapped IPv6 addresses, so a dual-stack socket (AF_INET6
// talking to ::ffff:a.b.c.d) and its AF_INET peer have matching keys.
//
// A read counter (hostaccel_rd, fexit on tcp_bpf_recvmsg; or hostaccel_rt, the
// sock_recv_length tracepoint) and the ledgers map bound what a receiver holds unread: the
// kernel charges moved data to the global tcp_mem, not to the receiving socket's buffer, so a
// stalled reader would otherwise let a writer pile up everything it sends. hostaccel_sm adds
// what it sends to the receiver's ledger entry, the counter what the receiver read; past
// settings.max_queued unread, the sender's direction takes TCP for good, whose flow control
// then holds the writer back.
#include <stddef.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define AF_INET 2
#define AF_INET6 10

/* addr.flags, the value of the pods tries. */
enum addr_flag {
	ADDR_LOCAL_POD = 1 << 0,
	ADDR_EXCLUDE = 1 << 1,
};

/* A TCP socket's ends: addresses in network byte order (IPv4 as ::ffff:a.b.c.d), ports in
 * host byte order. */
struct sock_key {
	__u32 local[4];
	__u32 remote[4];
	__u32 local_port;
	__u32 remote_port;
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
	__u32 flags;
};

struct settings {
	__u64 build;   /* agent bookkeeping: which object is loaded */
	__u32 enabled;  /* 0: no socket is entered (a set being replaced or removed) */
	__u32 draining; /* 1: no message is redirected any more (removal): see sk_msg */
	/* Unread bytes a receiver may hold before its peer's direction takes TCP; 0: no bound
	 * (hostaccel_rd is not attached, so nothing counts reads). Appended: the fields before
	 * keep their offsets, so an agent can drain a set of an older build. */
	__u64 max_queued;
	/* Bumped by the agent after each change of the pods tries: a ledger entry records the
	 * epoch its connection's ends were last found local Pods, not excluded, and hostaccel_sm
	 * looks them up again only when the epoch moved. */
	__u32 epoch;
	__u32 _pad;
};

/* A receiving socket's ledger, by its key: what its peer moved to it since it was entered and
 * what it read (from either queue), in bytes; and the settings' epoch at which the
 * connection's ends were last checked against the tries. */
struct ledger {
	__u64 sent;
	__u64 read;
	__u32 epoch;
	__u32 _pad;
};

enum stat {
	STAT_ENTERED4,     /* sockets entered into the map, IPv4 */
	STAT_ENTERED6,     /* sockets entered into the map, IPv6 */
	STAT_ENTER_FAILED, /* entering failed: map full, or the socket has another sockmap user's programs */
	STAT_REDIRECTED,   /* messages moved to the peer socket */
	STAT_PASSED,       /* messages left on the TCP path: the peer is not in the map */
	STAT_BOUNDED,      /* directions turned to TCP: the receiver held max_queued unread */
	STAT_RESUMED,      /* unused since bounded directions stay on TCP (kept: the slots' order) */
	STAT_READ,         /* reads by receivers in the ledger (the read counter) */
	NUM_STATS,
};

struct counter {
	__u64 count;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u64);
} hostaccel_socks SEC(".maps");

/* Directions of connections (the sender's key) that sent a message over TCP because the peer
 * was not in the map yet (the passive side is entered when the handshake's last ACK arrives,
 * after the active side may have sent): that data waits in the peer's TCP receive queue, and
 * a later message moved to the peer's socket queue would be read before it. Such a direction
 * stays on TCP for the connection's life. Deleted when the connection closes (sock_ops'
 * state callback); a new connection with the same tuple clears its own when it is entered.
 * An LRU still: beyond 65,536 such directions alive, the least recently used goes. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u8);
} tcp_only SEC(".maps");

/* The receivers' ledgers, by the receiving socket's key: sock_ops resets a socket's entry
 * when it enters it, hostaccel_sm adds what the peer sends, the read counter what the socket
 * read. Deleted when the socket closes (sock_ops' state callback); an LRU still: beyond
 * 65,536 sockets alive, the least recently used goes. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, struct ledger);
} ledgers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144); /* as tc's tries; allocated per entry (NO_PREALLOC) */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm4);
	__type(value, struct addr);
} pods4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144); /* as tc's tries; allocated per entry (NO_PREALLOC) */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6);
	__type(value, struct addr);
} pods6 SEC(".maps");

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

/* Context fields are read with an explicit load at a constant offset: clang otherwise merges
 * the loads of the two families' branches into one load through a computed pointer, which the
 * verifier refuses for the context ("dereference of modified ctx ptr"). */
#define CTX(ctx, field) ({ \
	__u32 __v; \
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(__v) : "r"(ctx), "i"(offsetof(typeof(*ctx), field))); \
	__v; \
})

static __always_inline void count(__u32 idx, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(&stats, &idx);
	if (c) {
		c->count++;
		c->bytes += bytes;
	}
}

/* pod reports whether addr (16 bytes, IPv4 mapped) is a local Pod's and not excluded. */
static __always_inline int pod(const __u32 *a)
{
	struct addr *v;
	if (a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff)) {
		struct lpm4 k = {.prefixlen = 32};
		__builtin_memcpy(k.addr, &a[3], 4);
		v = bpf_map_lookup_elem(&pods4, &k);
	} else {
		struct lpm6 k = {.prefixlen = 128};
		__builtin_memcpy(k.addr, a, 16);
		v = bpf_map_lookup_elem(&pods6, &k);
	}
	return v && (v->flags & (ADDR_LOCAL_POD | ADDR_EXCLUDE)) == ADDR_LOCAL_POD;
}

/* sock_key_of fills key with the socket's ends; 0 for a family other than IPv4 and IPv6. */
static __always_inline int sock_key_of(struct bpf_sock_ops *skops, struct sock_key *key)
{
	__u32 family = skops->family;
	if (family == AF_INET) {
		key->local[2] = bpf_htonl(0xffff);
		key->local[3] = CTX(skops, local_ip4);
		key->remote[2] = bpf_htonl(0xffff);
		key->remote[3] = CTX(skops, remote_ip4);
	} else if (family == AF_INET6) {
		key->local[0] = CTX(skops, local_ip6[0]);
		key->local[1] = CTX(skops, local_ip6[1]);
		key->local[2] = CTX(skops, local_ip6[2]);
		key->local[3] = CTX(skops, local_ip6[3]);
		key->remote[0] = CTX(skops, remote_ip6[0]);
		key->remote[1] = CTX(skops, remote_ip6[1]);
		key->remote[2] = CTX(skops, remote_ip6[2]);
		key->remote[3] = CTX(skops, remote_ip6[3]);
	} else {
		return 0;
	}
	key->local_port = skops->local_port;
	key->remote_port = bpf_ntohl(skops->remote_port);
	return 1;
}

SEC("sockops")
int hostaccel_so(struct bpf_sock_ops *skops)
{
	__u32 op = skops->op;
	struct sock_key key = {};
	/* An entered socket closes: its ledger and its direction's tcp_only entry go with it
	 * (the kernel takes it out of the sockhash). Before, they stayed until the LRUs evicted
	 * them, and on a busy node the dead connections' entries filled the maps, so that each
	 * new connection evicted an idle live one's: its ledger lost (its direction on TCP for
	 * good), or its tcp_only entry (its next message moved past its unread TCP data). */
	if (op == BPF_SOCK_OPS_STATE_CB) {
		if (skops->args[1] == BPF_TCP_CLOSE && sock_key_of(skops, &key)) {
			bpf_map_delete_elem(&ledgers, &key);
			bpf_map_delete_elem(&tcp_only, &key);
		}
		return 1;
	}
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	__u32 zero = 0;
	struct settings *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || !cfg->enabled)
		return 1;
	if (!sock_key_of(skops, &key))
		return 1;
	/* read before the tries: a change of them meanwhile bumps it past this */
	__u32 epoch = *(volatile __u32 *)&cfg->epoch;
	/* The same address at both ends: one network namespace (a Pod to itself). */
	if (key.local[0] == key.remote[0] && key.local[1] == key.remote[1] &&
	    key.local[2] == key.remote[2] && key.local[3] == key.remote[3])
		return 1;
	if (!pod(key.local) || !pod(key.remote))
		return 1;
	bpf_map_delete_elem(&tcp_only, &key);
	struct ledger fresh = {.epoch = epoch};
	bpf_map_update_elem(&ledgers, &key, &fresh, BPF_ANY);
	/* The active end is entered before its peer (the passive end at the handshake's last
	 * ACK): an entry under the peer's key is a closed socket's, with the same tuple. Gone, so
	 * a message sent before the peer is entered finds no ledger and takes TCP for good (the
	 * early data, see tcp_only), rather than a stale entry's counts. */
	if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
		struct sock_key peer = {
			.local = {key.remote[0], key.remote[1], key.remote[2], key.remote[3]},
			.remote = {key.local[0], key.local[1], key.local[2], key.local[3]},
			.local_port = key.remote_port,
			.remote_port = key.local_port,
		};
		bpf_map_delete_elem(&ledgers, &peer);
	}
	/* told of the socket's close (the ledger is written above whether or not it is entered) */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	if (bpf_sock_hash_update(skops, &hostaccel_socks, &key, BPF_NOEXIST) == 0)
		count(key.local[2] == bpf_htonl(0xffff) && key.local[0] == 0 && key.local[1] == 0 ? STAT_ENTERED4 : STAT_ENTERED6, 0);
	else
		count(STAT_ENTER_FAILED, 0);
	return 1;
}

SEC("sk_msg")
int hostaccel_sm(struct sk_msg_md *msg)
{
	/* The peer's key: its local end is our remote end. */
	struct sock_key key = {};
	__u32 family = msg->family;
	if (family == AF_INET) {
		key.local[2] = bpf_htonl(0xffff);
		key.local[3] = CTX(msg, remote_ip4);
		key.remote[2] = bpf_htonl(0xffff);
		key.remote[3] = CTX(msg, local_ip4);
	} else if (family == AF_INET6) {
		key.local[0] = CTX(msg, remote_ip6[0]);
		key.local[1] = CTX(msg, remote_ip6[1]);
		key.local[2] = CTX(msg, remote_ip6[2]);
		key.local[3] = CTX(msg, remote_ip6[3]);
		key.remote[0] = CTX(msg, local_ip6[0]);
		key.remote[1] = CTX(msg, local_ip6[1]);
		key.remote[2] = CTX(msg, local_ip6[2]);
		key.remote[3] = CTX(msg, local_ip6[3]);
	} else {
		return SK_PASS;
	}
	key.local_port = bpf_ntohl(msg->remote_port);
	key.remote_port = msg->local_port;
	/* Our own key: the peer's, ends swapped. */
	struct sock_key own = {
		.local = {key.remote[0], key.remote[1], key.remote[2], key.remote[3]},
		.remote = {key.local[0], key.local[1], key.local[2], key.local[3]},
		.local_port = key.remote_port,
		.remote_port = key.local_port,
	};
	__u32 size = msg->size;
	/* Draining (the datapath is being removed): every message takes TCP. Messages moved
	 * before wait in the peer's socket queue, which its reads empty before they turn to the
	 * TCP receive queue: the order holds. */
	__u32 zero = 0;
	struct settings *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->draining || bpf_map_lookup_elem(&tcp_only, &own)) {
		count(STAT_PASSED, size);
		return SK_PASS;
	}
	__u8 one = 1;
	struct ledger *l = bpf_map_lookup_elem(&ledgers, &key);
	/* Both ends must still be local Pods, not excluded: an exclusion added (or a Pod CIDR
	 * removed) after the connection was entered applies to its next message. From then on the
	 * direction takes TCP for good (what was moved before is read first: the order holds).
	 * Two trie lookups, only when the tries changed since the ledger's epoch (the agent bumps
	 * the settings' after writing them; read before the lookups, so that a change meanwhile
	 * makes the next message look again): they cost ~3% of a 64-byte TCP_RR a message. */
	__u32 epoch = *(volatile __u32 *)&cfg->epoch;
	if (!l || l->epoch != epoch) {
		if (!pod(own.local) || !pod(own.remote)) {
			bpf_map_update_elem(&tcp_only, &own, &one, BPF_ANY);
			count(STAT_PASSED, size);
			return SK_PASS;
		}
		if (l)
			l->epoch = epoch;
	}
	/* The bound: the peer holds max_queued or more unread (sent - read). The direction then
	 * takes TCP for good (TCP's receive window holds the writer back): the moved data waits
	 * in the peer's socket queue, which its reads empty before they turn to the TCP receive
	 * queue, so the order holds. It does not come back to being moved once the peer has read
	 * all: the ledger cannot tell when that is. A message passed to TCP that TCP takes only
	 * in part (a full send buffer: a non-blocking writer's short write) was counted whole, and
	 * the kernel sends the writer's next messages without running this program (it keeps the
	 * pass verdict until a push succeeds), uncounted: sent fell below what TCP carried, and a
	 * direction moved again before the peer had read its TCP data delivered a stream out of
	 * order (a review's test: 128 MiB in 1 MiB writes, a reader stalled 1 s). */
	__u64 max = cfg->max_queued;
	if (!l && max) {
		/* The peer's ledger was lost (LRU): what it holds is unknown. */
		bpf_map_update_elem(&tcp_only, &own, &one, BPF_ANY);
		count(STAT_PASSED, size);
		return SK_PASS;
	}
	if (l && max) {
		__s64 unread = (__s64)(l->sent - l->read);
		if (unread >= (__s64)max) {
			bpf_map_update_elem(&tcp_only, &own, &one, BPF_ANY);
			count(STAT_BOUNDED, unread);
			count(STAT_PASSED, size);
			return SK_PASS;
		}
	}
	if (bpf_msg_redirect_hash(msg, &hostaccel_socks, &key, BPF_F_INGRESS) == SK_PASS) {
		if (l)
			__sync_fetch_and_add(&l->sent, size);
		count(STAT_REDIRECTED, size);
		return SK_PASS;
	}
	bpf_map_update_elem(&tcp_only, &own, &one, BPF_ANY);
	count(STAT_PASSED, size);
	return SK_PASS;
}

/* The kernel's struct sock, the fields hostaccel_rd reads (CO-RE: offsets from the running
 * kernel's BTF). */
struct in6_addr {
	union {
		__u32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	union {
		struct {
			__u32 skc_daddr;
			__u32 skc_rcv_saddr;
		};
	};
	union {
		struct {
			__u16 skc_dport;
			__u16 skc_num;
		};
	};
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
	void *sk_user_data;
} __attribute__((preserve_access_index));

/* sk_user_data's flag of a socket with a psock (a socket in some sockmap; Linux >= 6.0). */
#define SK_USER_DATA_PSOCK 4UL

#define IPPROTO_TCP 6

#define MSG_PEEK 2

/* ACCOUNT defines name, which counts a read of copied bytes by socket sk in its ledger entry
 * when it has one (a socket of ours), its key computed as sock_ops computes it, reading sk's
 * fields with RD. MSG_PEEK reads leave the data queued. The tracing program's sk is typed
 * (BTF), so its fields are plain loads (RD_DIRECT); the raw tracepoint's is a number, read
 * with bpf_probe_read_kernel (BPF_CORE_READ), a helper call per field: seven more calls a
 * read cost the fexit counter ~3% of a 64-byte TCP_RR in the VM. */
#define RD_DIRECT(sk, field) ((sk)->field)
#define ACCOUNT(name, RD) \
static __always_inline void name(struct sock *sk, int copied, int flags) \
{ \
	if (copied <= 0 || (flags & MSG_PEEK) || !sk) \
		return; \
	struct sock_key key = {}; \
	__u16 family = RD(sk, __sk_common.skc_family); \
	if (family == AF_INET) { \
		key.local[2] = bpf_htonl(0xffff); \
		key.local[3] = RD(sk, __sk_common.skc_rcv_saddr); \
		key.remote[2] = bpf_htonl(0xffff); \
		key.remote[3] = RD(sk, __sk_common.skc_daddr); \
	} else if (family == AF_INET6) { \
		key.local[0] = RD(sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[0]); \
		key.local[1] = RD(sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[1]); \
		key.local[2] = RD(sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[2]); \
		key.local[3] = RD(sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[3]); \
		key.remote[0] = RD(sk, __sk_common.skc_v6_daddr.in6_u.u6_addr32[0]); \
		key.remote[1] = RD(sk, __sk_common.skc_v6_daddr.in6_u.u6_addr32[1]); \
		key.remote[2] = RD(sk, __sk_common.skc_v6_daddr.in6_u.u6_addr32[2]); \
		key.remote[3] = RD(sk, __sk_common.skc_v6_daddr.in6_u.u6_addr32[3]); \
	} else { \
		return; \
	} \
	key.local_port = RD(sk, __sk_common.skc_num); \
	key.remote_port = bpf_ntohs(RD(sk, __sk_common.skc_dport)); \
	struct ledger *l = bpf_map_lookup_elem(&ledgers, &key); \
	if (l) { \
		__sync_fetch_and_add(&l->read, copied); \
		count(STAT_READ, copied); \
	} \
}
ACCOUNT(account_typed, RD_DIRECT)
ACCOUNT(account_probed, BPF_CORE_READ)

/* hostaccel_rd: fexit on tcp_bpf_recvmsg, the recvmsg of a TCP socket in a sockmap, which
 * reads the socket queue (moved data) and the TCP receive queue and returns how much it
 * copied. Its arguments differ by kernel (5.17-5.18: sk, msg, len, nonblock, flags, addr_len;
 * 5.19-6.1: no nonblock; 6.18: no addr_len either), so they are read by position, flags after
 * nonblock where the kernel says there are six, and the return value with bpf_get_func_ret
 * (these helpers are of 5.17, as is the program). */
SEC("fexit/tcp_bpf_recvmsg")
int hostaccel_rd(unsigned long long *ctx)
{
	__u64 ret = 0, flags = 0;
	if (bpf_get_func_ret(ctx, &ret) ||
	    bpf_get_func_arg(ctx, bpf_get_func_arg_cnt(ctx) >= 6 ? 4 : 3, &flags))
		return 0;
	account_typed((struct sock *)ctx[0], (int)ret, (int)flags);
	return 0;
}

/* hostaccel_rt: the same count where the kernel refuses tracing (fentry/fexit) programs, from
 * the sock_recv_length tracepoint (Linux >= 6.3), which every recvmsg of every socket passes:
 * one read of sk_user_data turns away sockets without a psock (in no sockmap), the others
 * cost the key's reads and a hash lookup. */
SEC("raw_tp/sock_recv_length")
int BPF_PROG(hostaccel_rt, struct sock *sk, int ret, int flags)
{
	/* One read for the node's other sockets: only a socket in a sockmap has a psock. */
	if (!sk || !((unsigned long)BPF_CORE_READ(sk, sk_user_data) & SK_USER_DATA_PSOCK) ||
	    BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	account_probed(sk, ret, flags);
	return 0;
}

char _license[] SEC("license") = "GPL";
