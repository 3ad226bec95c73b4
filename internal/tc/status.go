package tc

import (
	"cmp"
	"context"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/hostaccel/hostaccel/internal/model"
)

// Device is a device the program is attached to.
type Device struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
	Role  Role   `json:"role"`           // 0: attached but not in the program's devices
	Peer  bool   `json:"peer,omitempty"` // packets for it go into its peer's namespace (bpf_redirect_peer)
	Mode  Mode   `json:"mode"`
}

// Counter counts packets and bytes (layer 2 lengths, as the device saw them).
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ClassCounter counts the packets of one class and family that were redirected.
type ClassCounter struct {
	Class  model.Class `json:"class"`
	Family string      `json:"family"` // "ipv4", "ipv6"
	Counter
}

// Why packets of an enabled class were handed to the stack (Status.Passed).
const (
	PassExcluded   = "excluded"
	PassTTL        = "ttl-expired"
	PassFragNeeded = "frag-needed"
	PassNoRoute    = "no-route"
	PassNAT        = "nat" // conntrack knows the flow as NAT-ed by this node
)

// How redirected packets left, besides the FIB's direct answer (Status.Via; these packets
// are in the class counters too).
const (
	ViaPeer          = "peer"           // bpf_redirect_peer into a Pod's namespace
	ViaNeigh         = "neigh"          // next hop unresolved: bpf_redirect_neigh resolved it
	ViaForwardingOff = "forwarding-off" // the FIB refused (forwarding off): the agent's route
	// ViaNATCarried: translated as conntrack says and redirected, packets of a NAT-ed TCP flow
	// the flowtable offloaded (Desired.NATCarry); in no class counter.
	ViaNATCarried = "nat-carried"
	// ViaExpress: by an express lane, a CPU's slot for the pair or for the carried flow
	// (internal/tc doc.go): the redirected and carried packets that cost the least.
	ViaExpress = "express"
)

// stat indices after the class counters (enum stat in bpf/fastpath.c), and whether the
// counter is one of Passed (else Via).
var stats = []struct {
	name   string
	passed bool
}{
	{PassExcluded, true},
	{PassTTL, true},
	{ViaNeigh, false},
	{PassFragNeeded, true},
	{PassNoRoute, true},
	{ViaForwardingOff, false},
	{PassNAT, true},
	{ViaPeer, false},
	{ViaNATCarried, false},
	{ViaExpress, false},
}

var numStats = len(Supported)*2 + len(stats)

// stat is the index of the counter name (one of stats) in the program's stats.
func stat(name string) int {
	for i, s := range stats {
		if s.name == name {
			return len(Supported)*2 + i
		}
	}
	panic(name)
}

// Status is the datapath as the kernel has it.
type Status struct {
	Mode      Mode               `json:"mode,omitempty"` // empty: not attached anywhere
	ProgramID ebpf.ProgramID     `json:"programID,omitempty"`
	NATCheck  string             `json:"natCheck,omitempty"` // where the program checks conntrack for NAT, or why it cannot
	NATCarry  bool               `json:"natCarry,omitempty"` // the program carries the NAT-ed TCP flows the flowtable offloaded (Via nat-carried)
	Devices   []Device           `json:"devices"`
	Classes   []ClassCounter     `json:"classes"`
	Passed    map[string]Counter `json:"passed"` // handed to the stack, by reason
	Via       map[string]Counter `json:"via"`    // redirected another way than the FIB's direct answer
	// Handed is the program's marks of client ends handed to the stack, where the NAT check
	// runs.
	Handed *HandedMarks `json:"handed,omitempty"`
}

// HandedMarks: how many client ends handed to the stack are marked (their replies are looked
// up in handed, the rest skip that lookup), of how many slots, and in which epoch: Apply ages
// the marks once more than 1/16 count (epoch - 1 agings since the program was loaded).
type HandedMarks struct {
	Marked int    `json:"marked"`
	Of     int    `json:"of"`
	Epoch  uint32 `json:"epoch"`
}

// Class sums the counters of class c over both families.
func (s Status) Class(c model.Class) Counter {
	var sum Counter
	for _, cc := range s.Classes {
		if cc.Class == c {
			sum.Packets += cc.Packets
			sum.Bytes += cc.Bytes
		}
	}
	return sum
}

// Status reads the attachments and the counters of the program set.
func (m *Manager) Status(ctx context.Context) (Status, error) {
	st := Status{Devices: []Device{}, Classes: []ClassCounter{}, Passed: map[string]Counter{}, Via: map[string]Counter{}}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	o, err := observe()
	defer o.Close()
	if err != nil {
		return st, err
	}
	set := o.current(buildID(true))
	if set == nil {
		set = o.current(buildID(false))
	}
	for _, a := range o.atts {
		s := o.sets[a.prog]
		if set == nil && s.usable() {
			set = s
		}
		dev := Device{Name: a.link.Attrs().Name, Index: a.link.Attrs().Index, Mode: a.mode}
		var e fastpathIface
		if s.usable() && s.maps.Ifaces.Lookup(uint32(dev.Index), &e) == nil {
			dev.Role, dev.Peer = Role(e.Role), e.Flags&flagPeer != 0
		}
		st.Devices = append(st.Devices, dev)
		if set != nil && a.prog == set.id && st.Mode == "" {
			st.Mode = a.mode
		}
	}
	slices.SortFunc(st.Devices, func(a, b Device) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Mode, b.Mode)) })
	if set == nil {
		return st, nil
	}
	st.ProgramID = set.id
	// The settings, read once; nil where they cannot be read. Only a set of the build that
	// calls conntrack's kfuncs checks for NAT.
	var cfg *fastpathSettings
	if c := new(fastpathSettings); set.settings.Lookup(uint32(0), c) == nil {
		cfg = c
	}
	kfuncs := set.build == buildID(true)
	st.NATCheck = natCheckText(kfuncs, cfg)
	st.NATCarry = kfuncs && cfg != nil && cfg.Flags&settingsNATCarry != 0
	if kfuncs && cfg != nil && cfg.NatCheck != 0 {
		n, err := set.handedMarked(cfg.HandedSince)
		if err != nil {
			return st, err
		}
		st.Handed = &HandedMarks{Marked: n, Of: handedMarks, Epoch: cfg.HandedEpoch}
	}
	n, err := set.counters()
	if err != nil {
		return st, err
	}
	for i, c := range Supported {
		for f, fam := range []string{"ipv4", "ipv6"} {
			st.Classes = append(st.Classes, ClassCounter{Class: c, Family: fam, Counter: n[i*2+f]}) // class*2 + family
		}
	}
	for i, s := range stats {
		if s.passed {
			st.Passed[s.name] = n[len(Supported)*2+i]
		} else {
			st.Via[s.name] = n[len(Supported)*2+i]
		}
	}
	return st, nil
}

// natCheckText says where a set with settings cfg (nil: unreadable) checks conntrack for NAT;
// kfuncs: the set was loaded with conntrack's kfuncs.
func natCheckText(kfuncs bool, cfg *fastpathSettings) string {
	if !kfuncs {
		return "unavailable: the program was loaded without the kernel's conntrack kfuncs (`hostaccel probe`: bpf_skb_ct_lookup); NAT-ed flows are not recognised"
	}
	if cfg == nil {
		return ""
	}
	switch cfg.NatCheck {
	case 0:
		return string(model.NATCheckOff)
	case natCheckTowardPods:
		return string(model.NATCheckTowardPods)
	}
	return string(model.NATCheckBoth)
}
