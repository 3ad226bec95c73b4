// Package tc is the tc datapath: an eBPF router at tc ingress of the gateway and transport
// devices. Render turns a model.State into the Desired contents of the program's maps (pure);
// Manager loads, attaches, updates, observes and removes the program set in the calling
// thread's network namespace.
//
// Files by concern: render.go (model -> Desired), maps.go (Desired -> map contents: the
// flattened address trie, flags), progset.go (the loaded program and its typed maps, found
// again by ID), observe.go (what the kernel has attached), attach.go (tcx, clsact + cls_bpf),
// routes.go (the agent's fallback routes), manager.go (Apply, Remove), status.go (counters).
//
// # Per packet (bpf/fastpath.c)
//
// Frames not addressed to the device (pkt_type != HOST), VLAN-tagged ones, devices not in
// the ifaces map, non-IP, IPv4 with options or fragments, IPv6 with extension headers and
// anything but TCP and UDP (ICMP and its errors, ND, ARP) are handed on untouched. Each
// address is looked up once in one LPM trie per family, whose value holds all its roles (local
// Pod, peer Pod, peer node, excluded: the agent gives every prefix the roles of the prefixes
// that contain it) and the agent's route. The destination comes first: on a gateway it must be
// a peer Pod or peer node (or a local Pod, where local-pod-to-pod is on), on a transport a
// local Pod; anything else (a ClusterIP, a NodePort, the node) passes after that one lookup.
// Then the source: on a gateway, local Pod -> local Pod is local-pod-to-pod (where it is on;
// else a local Pod inside a peer Pod CIDR stays pod-to-pod), local Pod -> peer Pod pod-to-pod
// and local Pod -> peer node node-to-remote-pod (the replies); on a transport, peer Pod ->
// local Pod and peer node -> local Pod. Disabled classes and excluded sources or destinations
// pass; so does a TTL / hop limit <= 1 (the stack sends time exceeded).
//
// The NAT check (between the two lookups): a packet from the Pods' side to an address of no
// class (a ClusterIP, a NodePort) goes to the stack, which may NAT it; its client end is
// remembered (LRU map handed, and a mark of a hash of it in handed_marks), by the SYN for TCP
// (which also voids what was kept of an older connection from that end). A packet to a
// remembered end is a reply that may need the un-NAT: its tuple is looked up in conntrack
// (bpf_skb_ct_lookup, Linux >= 5.18; the reference is released on every path), and a flow
// conntrack knows as source- or destination-NAT-ed by this node (a backend Pod's reply to a
// ClusterIP connection, a local Pod's reply to a NodePort connection without SNAT) goes to the
// stack, which un-NATs it (and in auto, the flowtable accelerates it). The answer is kept in
// the end's entry, with the server end it was about, for 100 ms: far below any conntrack
// timeout, so it stands for an entry conntrack still holds; meanwhile the replies cost one
// hash lookup. Pure pod-to-pod flows have no entry at all (both directions are redirected, so
// the stack never sees them): their destination's mark is void (one inlined array read), and
// they keep the redirect. An end whose mark counts but that handed does not hold (it shares its
// mark with a handed end, or the LRU forgot it) is asked about in conntrack too, even where a
// pair is kept for its two addresses by a direct flow: a NAT-ed flow's end is entered again,
// a direct flow's answer is kept per flow for 100 ms (direct_flows: per CPU, 4,096 slots
// direct-mapped by the flow's hash, 192 KiB a CPU), and its packets keep the pair meanwhile.
// That costs such an end's packets ~170 instructions each (BenchmarkProgram
// to-local-pod-marks-full: 1,172 -> 1,343 in the VM; a hash map of flows cost ~350); ends
// whose mark does not count pay nothing. A mark is the epoch (settings.handed_epoch) in which its end was
// handed; marks below settings.handed_since are void. Every end handed to the stack marks one
// (every DNS query to a ClusterIP from a new port), so Apply ages them (handed.go) once more than
// 1/16 of a sample are set, at most once a minute: a new epoch, the client ends of the NAT-ed
// connections conntrack still holds marked with it (and entered in handed again), then the
// older marks void. Marks are whole values that the program and the agent only ever set to the
// current epoch, so neither undoes the other's. Without aging a long-running node's marks all
// end up set, and every packet toward the Pods takes the handed lookup and the pairs' way:
// 1,166 instead of 293 instructions per packet in the VM (BenchmarkProgram
// to-local-pod-marks-full). Where the
// check runs is the config's tc.natCheck: both directions (default), toward-pods (packets
// arriving on a transport), or off. The kfuncs are linked at load time: the agent tells the
// program (a read-only variable) whether the kernel's BTF has them, and loads it again once
// nf_conntrack appears; without them the check is skipped and status says so.
//
// NAT carry (tc.natCarry, on by default): a NAT-ed TCP flow that the flowtable has offloaded
// (conntrack's IPS_OFFLOAD: the flowtable's class rules chose it, made conntrack's window
// tracking liberal, and keep the entry alive) is carried here rather than handed on: the
// packet's tuple is looked up in conntrack (kept 100 ms per tuple in nat_flows, with the
// checksums' changes precomputed), the packet is rewritten to what conntrack's other tuple
// says (addresses and ports in place, IPv4's header checksum by RFC 1624, TCP's by
// bpf_l4_csum_replace, which knows a CHECKSUM_PARTIAL packet), routed by its new destination and
// redirected. SYN, FIN and RST take the stack, so conntrack and the flowtable see every change
// of state (a FIN tears the flowtable's flow down; the next answer then passes). When the
// flowtable's flow times out (nothing reaches it), the packets take the stack until it offloads
// the flow again. The node's own addresses on the gateways are entered (ADDR_NODE), so that a
// masqueraded reply to the node is recognised as the node's.
//
// bpf_fib_lookup then routes the packet from its input device. On success to one of our
// devices the TTL / hop limit is decremented (the IPv4 checksum adjusted incrementally), the
// MACs of the FIB's answer are written (never configured ones), and the packet leaves with
// bpf_redirect_peer when the output device is a veth whose peer is in another network
// namespace (a Pod's: ingress to ingress, no second pass through a backlog queue; the frame
// keeps pkt_type HOST, which is all kernels before 6.15 need), else with bpf_redirect to the
// device's egress. An unresolved neighbour goes out with bpf_redirect_neigh to the FIB's next
// hop (the neighbour code resolves it, queueing meanwhile). The FIB checks the MTU of packets
// sent as they are (IPv6 against the device's IPv6 MTU, which kept answers check too); GSO
// packets are checked by segment (bpf_check_mtu), and IPv6 ones out of a device whose IPv6 MTU
// is below its MTU pass. A packet too big, no route, or a route through a device that is not
// ours passes, so the stack sends the ICMP error or does whatever it would have done. The
// program drops a packet in two cases only: a NAT-carried packet whose rewrite failed half
// way (it cannot be handed on), and a redirect to a device deleted since the last sync (the
// kernel drops it, until the agent's sync on the link event).
//
// # Kept decisions
//
// Where the FIB's answers may be kept (SETTINGS_NEXTHOP_CACHE: routing depends on the
// destination alone: no policy rules, and no main-table route with an MTU of its own or a
// TOS selector; a destination that a route with a source prefix or several next hops the
// kernel picks by the addresses decides, ADDR_PAIR_ONLY, keeps its answers per pair only;
// one that several next hops picked per flow decide (the ports: fib_multipath_hash_policy 1;
// IPv6's flow label), ADDR_NO_KEEP, keeps none: every packet takes the full way, with no
// kept decision and no express lane, and asks the FIB with its ports),
// a FIB answer is kept per destination and ingress device for up to a
// second (nexthops), and what was decided for a redirected packet (its class, the
// destination's roles, the device's role and the next hop) per pair of addresses and ingress
// device (pairs4, pairs6: LRU). A packet that finds its pair, of the generation it read at its start,
// unexpired, skips the device's, both addresses' and the next hop's lookups for that one;
// its TTL, its size against the device's MTU, its class being on and the NAT check
// (a reply to a handed end takes the full way) are checked every packet. A bit per hash of the
// pair (pair_bits) is set when a pair is kept: packets without a pair (all those handed to the
// stack) skip the lookup for an inlined array read. The agent bumps the generation before it
// writes the maps and again after (so that what a packet decided from half-written maps is
// void too), and then clears the bits. The two maps hold 65,536 pairs each, preallocated:
// 19.5 MiB of kernel memory (memlock: pairs4 8.9, pairs6 10.5 MiB; the set's other maps
// 39 MiB, most of it handed, nat_flows and nexthops; handed_marks 2 MiB). Measured: the program's cost per
// redirected packet about halved (BenchmarkProgram), per packet 0.71 -> 0.81 of the direct
// link in the VM (docs/benchmarks/2026-11-26-064c045-pairs.md).
//
// # The express lane
//
// In front of the pairs, each CPU keeps the pairs it forwarded lately in slots (slots4,
// slots6: per-CPU arrays of 4,096, direct-mapped by the pair's hash), each with all a packet
// needs: the generation, an expiry in jiffies, the output device and its MTU, both MACs (the
// kept FIB answer's), whether it goes with bpf_redirect_peer and whether the NAT check applies.
// A packet whose slot holds its pair (same addresses and ingress device) of the current
// generation, unexpired, with hops left, that fits the MTU and whose destination end has no
// handed mark is redirected at once: its hash from registers, one per-CPU lookup, one counter,
// no struct flow built. Anything else takes the pairs' way, which fills the slot where a pair
// holds (so the first packet of a pair goes the full way, the second by its pair, the rest by
// the slot). Per CPU, so that no other CPU writes a slot while it is read; the agent never
// writes a slot: a new generation voids them all. Expiry is in jiffies (bpf_jiffies64) because
// bpf_ktime_get_coarse_ns cost 56 instructions per packet on the VM's 6.1 kernel; the agent
// gives the program a jiffy's length (settings.tick_ns, the coarse clocks' resolution) and a
// slot lasts no longer than its next hop's answer. A slot's packets count once, in a block of
// their own (STAT_EXPRESS_CLASS: by class and family, then again for those that go into a Pod's
// namespace); the agent adds them to their class, to peer where they went into a Pod, and to
// `via express` in `hostaccel status` and the metrics (with the NAT express lane's, below: the
// redirected and carried packets that cost the least). Kernel memory: 136 bytes per slot and
// CPU (a 56-byte IPv4 and an 80-byte IPv6 slot), 360 with the NAT express lane's: 4,096 slots
// per CPU (1.4 MiB) up to 22 CPUs; on larger machines the agent loads fewer (a power of two, at
// least 256: slotsPerCPU) so that the four maps stay within 32 MiB, and sets the program's
// slot_mask to match (a load-time constant: 3-4 instructions per packet).
// Measured: BenchmarkProgram in the VM under icount, where a nanosecond is an instruction
// (vmtest/run-in-vm.sh -i): 711 -> 330 instructions per redirected packet, against 83 for a
// program that only writes the MACs and redirects (docs/benchmarks/2026-11-26-a1debbe-express.md);
// 293 since both MACs are written in two copies instead of twelve bytes and the handed check
// compares a mark instead of testing a bit (2026-11-27).
//
// # The NAT express lane
//
// Carried flows (NAT carry, above) have a lane of their own beside it: per CPU, the carried
// flows this CPU translated lately (nat_slots4, nat_slots6: per-CPU arrays of as many slots as
// the pairs' lane, direct-mapped by the hash of the packet's addresses and ports, an IPv6
// address folded to one word), each with what the packet becomes (addresses, ports, the
// checksums' changes) and the way it is sent (the flow's kept FIB answer: device, MTU, MACs,
// peer or not). A TCP packet without SYN, FIN or RST whose slot holds its addresses, ports and
// ingress device, of the packet's generation, within what is left of conntrack's answer (the
// slot's expiry is the answer's 100 ms: conntrack is asked again as often as on the full way),
// with hops left, that fits the MTU and whose flow was not voided since, is translated (the
// addresses, ports and IPv4 checksum written in place, TCP's checksum by bpf_l4_csum_replace
// as on the full way), its TTL / hop limit decremented and redirected: no LPM lookup, no
// nat_flows lookup, no struct flow built. The full way fills the slot whenever it carries a
// packet by the flow's kept answer (so the packets right after each conntrack answer go the full
// way). Voiding: a packet with SYN, FIN or RST of a flow (which takes the full way, where
// carried() forgets the flow's answer) bumps the flow's word in nat_voids, a shared array of
// 65,536 words indexed by the same hash, which every slot of that flow on every CPU compares
// with the word it was filled with; a new generation voids every slot. Its packets count once,
// in STAT_NAT_EXPRESS (then again for those moved into a Pod's namespace); the agent adds them
// to nat-carried, to express, and to peer. Kernel memory: 88 (IPv4) and 136 (IPv6) bytes per
// slot and CPU, in the same 32 MiB budget as the pairs' slots (4,096 slots per CPU up to 22
// CPUs), and 256 KiB for nat_voids. Measured: docs/benchmarks/2026-11-27-abd5b1b-nat-express.md.
//
// "Pass" is TC_ACT_UNSPEC, not TC_ACT_OK: the next tcx program or tc filter still runs (with
// tcx, TC_ACT_OK would skip them), then the stack.
//
// # Forwarding disabled
//
// bpf_fib_lookup returns BPF_FIB_LKUP_RET_FWD_DISABLED whenever forwarding is off on the
// device it is given, whatever the flags: net/core/filter.c checks IN_DEV_FORWARD (IPv6:
// idev->cnf.forwarding) before it looks at BPF_FIB_LOOKUP_DIRECT or _OUTPUT. So every routed
// prefix of the trie carries the device of the most specific main-table route that covers it
// (refreshed on every Apply; 0 when that is not one of our devices). When the FIB refuses, the
// program checks the MTU of that device and calls bpf_redirect_neigh without a next hop: the
// helper's own output route lookup (ip_route_output_flow, which has no forwarding check) finds
// the gateway, and the neighbour code resolves it. These packets are counted as
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
// (an upgrade, or the conntrack kfuncs appearing: the settings record a hash of the object
// and whether they were linked) is atomic per device (BPF_F_REPLACE, or replacing the filter
// in place); a new set's maps are filled before it is attached anywhere.
//
// # Caveats
//
// Redirected packets skip netfilter and conntrack on this node: put endpoints that policy,
// QoS or logging must see in Exclude. Counters restart when the program set is replaced.
package tc
