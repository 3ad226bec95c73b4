package tc

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/hostaccel/hostaccel/internal/model"
)

// Role is what a device is to the node; the program matches a class differently on each.
type Role uint32

// Roles, as the program's ifaces map holds them.
const (
	RoleGateway   Role = 1 // towards the local Pods
	RoleTransport Role = 2 // towards peer nodes
)

func (r Role) String() string {
	switch r {
	case RoleGateway:
		return "gateway"
	case RoleTransport:
		return "transport"
	}
	return fmt.Sprintf("role(%d)", uint32(r))
}

// MarshalText writes the role's name (JSON status).
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a role's name.
func (r *Role) UnmarshalText(b []byte) error {
	for _, v := range []Role{RoleGateway, RoleTransport} {
		if string(b) == v.String() {
			*r = v
			return nil
		}
	}
	return fmt.Errorf("unknown role %q", b)
}

// Supported lists the classes the tc datapath serves: those that need no NAT, so that a
// router without state of its own can carry them. Their bits in the program's settings are
// 1 << index. Which datapath serves which class is the plan's choice (internal/datapath) and
// config validation's; Render serves the enabled classes of this list and no other.
var Supported = model.TCClasses

// NATCheck says where the program asks conntrack whether this node's stack NATs a flow
// (bpf_skb_ct_lookup); such flows are handed to the stack, which un-NATs them.
type NATCheck = model.NATCheck

// Desired is what the program's maps should hold.
type Desired struct {
	Devices  map[string]Role // device name -> role
	LocalPod []netip.Prefix  // this node's Pod CIDRs
	PeerPod  []netip.Prefix  // peer nodes' Pod CIDRs
	PeerNode []netip.Prefix  // peer nodes' IPs, as host prefixes
	Exclude  []netip.Prefix  // never redirected, as source or destination
	Classes  []model.Class   // enabled classes, all in Supported
	NATCheck NATCheck        // where the program looks flows up in conntrack
	// NATCarry: the program carries the established TCP flows this node NATs that the
	// flowtable offloaded (translated as conntrack says, and redirected); needs NATCheck.
	NATCarry bool
}

// Render computes the Desired state for s. It is pure. A device that is both gateway and
// transport is an error.
func Render(s model.State) (*Desired, error) {
	var errs []error
	d := &Desired{Devices: map[string]Role{}, NATCheck: s.TCNATCheck, NATCarry: !s.TCNoNATCarry}
	if d.NATCheck == "" {
		d.NATCheck = model.NATCheckBoth
	}
	for _, c := range Supported {
		if s.Enabled(c) {
			d.Classes = append(d.Classes, c)
		}
	}
	for _, g := range s.Gateways {
		d.Devices[g] = RoleGateway
	}
	for _, t := range s.Transports {
		if d.Devices[t] == RoleGateway {
			errs = append(errs, fmt.Errorf("node: device %q is both a gateway and a transport", t))
			continue
		}
		d.Devices[t] = RoleTransport
	}
	d.LocalPod = canonical(s.LocalPodCIDRs)
	d.PeerPod = canonical(s.PeerPodCIDRs)
	d.Exclude = canonical(s.Exclude)
	var hosts []netip.Prefix
	for _, a := range s.PeerNodeIPs {
		hosts = append(hosts, netip.PrefixFrom(a, a.BitLen()))
	}
	d.PeerNode = canonical(hosts)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return d, nil
}

// canonical masks, unmaps, sorts and de-duplicates prefixes (LPM trie keys must be masked).
func canonical(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	model.SortPrefixes(out)
	return slices.Compact(out)
}

// classBits is the settings' class mask for cs.
func classBits(cs []model.Class) uint32 {
	var bits uint32
	for i, c := range Supported {
		if slices.Contains(cs, c) {
			bits |= 1 << i
		}
	}
	return bits
}

// natCheckBits is the settings' nat_check for n (enum nat_check in bpf/fastpath.c).
func natCheckBits(n NATCheck) uint32 {
	switch n {
	case model.NATCheckOff:
		return 0
	case model.NATCheckTowardPods:
		return natCheckTowardPods
	}
	return natCheckTowardPods | natCheckFromPods
}
