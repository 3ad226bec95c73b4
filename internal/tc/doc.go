// Package tc is the tc datapath: a stateless eBPF router at tc ingress of the gateway and
// transport devices. Render turns a model.State into the Desired contents of the program's
// maps (pure); Manager loads, attaches, updates, observes and removes the program set in the
// calling thread's network namespace.
//
// # Per packet (bpf/fastpath.c)
//
// Frames not addressed to the device (pkt_type != HOST), VLAN-tagged ones, devices not in
// the ifaces map, non-IP, IPv4 with options, IPv6 with extension headers and anything but
// TCP and UDP (ICMP and its errors, ND, ARP) are handed on untouched. The class follows from
// the addresses and the role of the input device: on a gateway, local Pod -> peer Pod is
// pod-to-pod and local Pod -> peer node node-to-remote-pod (the replies); on a transport,
// peer Pod -> local Pod and peer node -> local Pod. Disabled classes and excluded sources or
// destinations pass; so does a TTL / hop limit <= 1 (the stack sends time exceeded). Then
// bpf_fib_lookup routes the packet from its input device: on success to one of our devices,
// the TTL / hop limit is decremented (IPv4 checksum fixed with bpf_l3_csum_replace) and
// bpf_redirect_neigh sends it to the FIB's next hop, the kernel filling in both MACs from its
// neighbour table. An unresolved neighbour, a packet too big for the route (GSO packets are
// checked by segment) or any other outcome passes, so the stack resolves, sends the ICMP
// error, or does whatever it would have done. Nothing is ever dropped.
//
// "Pass" is TC_ACT_UNSPEC, not TC_ACT_OK: the next tcx program or tc filter still runs (with
// tcx, TC_ACT_OK would skip them), then the stack.
//
// # Forwarding disabled
//
// bpf_fib_lookup returns BPF_FIB_LKUP_RET_FWD_DISABLED whenever forwarding is off on the
// device it is given, whatever the flags: net/core/filter.c checks IN_DEV_FORWARD (IPv6:
// idev->cnf.forwarding) before it looks at BPF_FIB_LOOKUP_DIRECT or _OUTPUT. Verified on
// Linux 6.18 with flags 0, DIRECT, OUTPUT, OUTPUT|DIRECT and SKIP_NEIGH, with the input
// device and with lo. So the agent gives the program a route of its own: every local_pod,
// peer_pod and peer_node entry carries the device of the most specific main-table route that
// covers the whole prefix (refreshed on every Apply; 0 when that is not one of our devices).
// When the FIB refuses, the program checks the MTU of that device (bpf_check_mtu) and calls
// bpf_redirect_neigh without a next hop: the helper's own output route lookup on that device
// (ip_route_output_flow, which has no forwarding check) finds the gateway, and the neighbour
// code resolves it, queueing rather than dropping. These packets are also counted as
// "forwarding-off". On a node that forwards, the FIB decides every packet.
//
// # Attaching and finding it again
//
// One program set (program and maps) per network namespace, shared by all devices. With tcx
// (Linux >= 6.6) the program is attached with BPF_PROG_ATTACH (the mprog API, no bpf_link),
// appended after other programs; otherwise through a clsact qdisc (created if missing, and
// then removed by Remove if nothing else is on it) and a cls_bpf direct-action filter named
// hostaccel_fastpath at a fixed priority and handle. Either way the attachment belongs to the
// device: it outlives the process without bpffs pins, vanishes with the device, and any later
// process, in any mount namespace (ip netns exec has no /sys/fs/bpf), finds it by asking the
// kernel: tcx programs of each device (BPF_PROG_QUERY) and its cls_bpf filters (netlink),
// program ID -> name hostaccel_fp -> maps by the program's map IDs. Replacing the program
// (an upgrade: the config map records a hash of the object it was loaded from) is atomic per
// device (BPF_F_REPLACE, or replacing the filter in place); a new set's maps are filled before
// it is attached anywhere.
//
// # Caveats
//
// Redirected packets skip netfilter and conntrack on this node: put endpoints that policy,
// QoS or logging must see in Exclude. Counters restart when the program set is replaced.
package tc
