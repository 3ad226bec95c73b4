// Package sockmap is the sockmap datapath: TCP between two Pods of this node (the
// local-pod-to-pod class) carried socket to socket by eBPF, past both TCP/IP stacks and the
// node's forwarding. Render turns a model.State into the Desired contents of the programs'
// maps (pure); Manager loads, attaches, updates, observes, drains and removes the program set.
//
// Files: bpf/sockmap.c (the programs), render.go (model -> Desired), progset.go (the loaded
// set and its typed maps, found again by ID), cgroup.go (the cgroup v2 and BPF filesystem
// mounts), manager.go (Apply, Remove), status.go (counters).
//
// # Per socket and per message
//
// A sock_ops program on the cgroup v2 root (found in /proc/self/mountinfo; hybrid hosts mount
// it at /sys/fs/cgroup/unified) sees every TCP socket of the node reach ESTABLISHED. It enters
// the socket into a SOCKHASH when both ends are local Pod addresses (LPM tries of the Pod
// CIDRs), neither is excluded, and they differ. A Pod's address belongs to one network
// namespace on the node, so the 4-tuple is unique on the node and is the key; loopback
// (every Pod has its own 127.0.0.1) and a Pod talking to its own address are never entered.
// IPv4 is keyed as IPv4-mapped IPv6, so a dual-stack socket matches its AF_INET peer.
//
// An sk_msg program attached to the sockhash runs for every sendmsg / sendfile of a socket in
// it and moves the message to the peer socket's receive queue (bpf_msg_redirect_hash with
// BPF_F_INGRESS). It checks both ends against the tries again when they changed since the
// connection's last check (settings.epoch, bumped by Apply after it writes them). When the peer is not in the map (a connection through a Service DNAT: the
// client's peer is the ClusterIP; the peer taken by another sockmap user; the map full) the
// message takes TCP, and that direction of the connection stays on TCP for its life (the
// tcp_only LRU): the message waits in the peer's TCP receive queue, and a later message moved
// to the peer's socket queue would be read first (the kernel reads that queue first).
//
// # Bounded unread data
//
// The kernel charges data moved to a socket to the global tcp_mem, not to the socket's receive
// buffer, so nothing would hold a fast writer back from a stalled reader. The sk_msg program
// adds what it sends to the receiving socket's entry in the ledgers map; a read counter adds
// what the socket read: hostaccel_rd (fexit on tcp_bpf_recvmsg) or, where the kernel refuses
// tracing programs, hostaccel_rt (the sock_recv_length raw tracepoint, Linux >= 6.3). When
// sent - read reaches settings.max_queued (Manager.MaxQueued, DefaultMaxQueued: 16 MiB), the
// sender's messages take TCP for good (tcp_only), whose flow control holds the writer back. The
// moved data is read before TCP's, so the order holds. The direction is not moved again once
// the receiver has read all: the ledger cannot tell when that is (a message TCP takes only in
// part was counted whole, and the kernel sends the next ones without running the program until
// a push succeeds); moving again on its word reordered streams. max_queued is 0 (no bound)
// while no read counter is attached.
//
// # Attaching, finding it again, removing
//
// The sock_ops program is attached with BPF_PROG_ATTACH and BPF_F_ALLOW_MULTI (beside other
// users' programs); that attachment outlives the process. The sk_msg program stays on the
// sockhash only while the map has a file descriptor or a pin (the kernel releases a sockmap's
// programs with its last user reference), so the sockhash is pinned at
// <bpffs>/hostaccel/sockmap-<sock_ops program ID> (bpffs from mountinfo, mounted at
// /sys/fs/bpf when there is none). A later process finds the set by asking the kernel: the
// cgroup's sock_ops programs -> name hostaccel_so -> its maps -> the sockhash's sk_msg
// program (BPF_PROG_QUERY on a sockmap: Linux >= 6.0). The read counter is a BPF link pinned
// at <bpffs>/hostaccel/reader-<sock_ops program ID>, found again by that pin.
//
// Removing (and replacing a set of another build) drains: the sock_ops program leaves the
// cgroup, nothing new is entered, and every message from then on takes TCP; data already moved
// to a socket's queue is read before its TCP receive queue, so open connections go on without
// loss or reordering. The map stays pinned while sockets are in it (they leave as they close);
// a later Remove or Apply removes the pin of an empty map, and the kernel frees the maps and
// programs. Status reports those sockets as draining. A set whose sock_ops program someone
// else took off the cgroup is found by its pin, and the next Apply or Remove drains it too
// (its settings reached through the sk_msg program on its map).
//
// # Caveats
//
// Messages skip netfilter, tc and conntrack accounting on both sides (the handshake and
// FIN/RST still take the stack, so policy that decides at connection setup still applies).
// splice(2) from a socket does not see moved data. A socket takes one sk_msg program: sockets another sockmap
// user entered first are not ours, and it cannot enter ours (EBUSY).
package sockmap
