package sockmap

import (
	"context"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Counter counts events and the bytes they carried.
type Counter struct {
	Count uint64 `json:"count"`
	Bytes uint64 `json:"bytes,omitempty"`
}

// Status is the datapath as the kernel has it.
type Status struct {
	Cgroup       string         `json:"cgroup"`
	ProgramID    ebpf.ProgramID `json:"programID"`              // the sock_ops program
	MsgProgramID ebpf.ProgramID `json:"msgProgramID,omitempty"` // the sk_msg program (Linux >= 6.0 says)
	Sockets      int            `json:"sockets"`                // sockets in the map now
	// Entered counts the sockets entered into the map, by family ("ipv4", "ipv6").
	Entered map[string]uint64 `json:"entered"`
	// EnterFailed counts sockets that qualified but could not be entered: the map was full,
	// or the socket carries another sockmap user's programs.
	EnterFailed uint64 `json:"enterFailed"`
	// Redirected counts the messages (sendmsg, sendfile calls) moved to the peer socket.
	Redirected Counter `json:"redirected"`
	// Passed counts the messages of sockets in the map left on the TCP path: the peer was not
	// in the map (a connection through a Service's DNAT, the peer taken by another user).
	Passed Counter `json:"passed"`
	// MaxQueued is the bound on the bytes moved to a receiving socket and not read yet; past
	// it, the sender's direction takes TCP. 0: no bound (ReadCounter false).
	MaxQueued uint64 `json:"maxQueued"`
	// ReadCounter is where the program counting what receivers read is attached
	// ("fexit/tcp_bpf_recvmsg", or "raw_tp/sock_recv_length" where the kernel refuses tracing
	// programs); empty: none is, and there is no bound.
	ReadCounter   string         `json:"readCounter,omitempty"`
	ReadProgramID ebpf.ProgramID `json:"readProgramID,omitempty"`
	// Bounded counts the directions that took TCP for good because the receiver held
	// MaxQueued unread (Bytes: what it held then, summed).
	Bounded Counter `json:"bounded"`
	// Read counts the reads of moved data by receivers (hostaccel_rd).
	Read Counter `json:"read"`
	// Draining counts the sockets still in the maps of sets that were removed or replaced:
	// their messages take TCP; the maps go when these sockets close (Manager.Remove).
	Draining int            `json:"draining,omitempty"`
	LocalPod []netip.Prefix `json:"localPod,omitempty"`
}

// Stat indices (enum stat in bpf/sockmap.c).
const (
	statEntered4 = iota
	statEntered6
	statEnterFailed
	statRedirected
	statPassed
	statBounded
	_ // STAT_RESUMED: unused since bounded directions stay on TCP
	statRead
)

// Status reads the set attached to the cgroup; nil when there is none.
func (m *Manager) Status(ctx context.Context) (*Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cg, err := m.cgroup()
	if err != nil {
		return nil, nil // no cgroup2 root here: nothing of ours can be attached where we see
	}
	o, err := observe(cg)
	defer o.Close()
	if err != nil {
		return nil, err
	}
	pins, _ := m.pins()
	set := o.current(pins)
	if set == nil {
		for _, s := range o.sets {
			if s.usable() {
				set = s
				break
			}
		}
	}
	var draining int
	if pins != "" {
		draining, _ = drained(pins, o.sets, false)
	}
	if set == nil {
		if draining > 0 {
			return &Status{Cgroup: cg, Entered: map[string]uint64{}, Draining: draining}, nil
		}
		return nil, nil
	}
	st := &Status{Cgroup: cg, ProgramID: set.opsID, Entered: map[string]uint64{}, Draining: draining}
	if set.msg != nil {
		if info, err := set.msg.Info(); err == nil {
			st.MsgProgramID, _ = info.ID()
		}
	}
	socks, err := set.sockets()
	if err != nil {
		return st, err
	}
	st.Sockets = len(socks)
	n, err := set.counters()
	if err != nil {
		return st, err
	}
	st.Entered["ipv4"] = n[statEntered4].Count
	st.Entered["ipv6"] = n[statEntered6].Count
	st.EnterFailed = n[statEnterFailed].Count
	st.Redirected = Counter{n[statRedirected].Count, n[statRedirected].Bytes}
	st.Passed = Counter{n[statPassed].Count, n[statPassed].Bytes}
	if len(n) > statRead {
		st.Bounded = Counter{n[statBounded].Count, n[statBounded].Bytes}
		st.Read = Counter{n[statRead].Count, n[statRead].Bytes}
	}
	if cfg, err := set.settings(); err == nil {
		st.MaxQueued = cfg.MaxQueued
	}
	if pins != "" {
		if l, err := link.LoadPinnedLink(filepath.Join(pins, ReaderPinName(set.opsID)), nil); err == nil {
			st.ReadCounter = "attached"
			if info, err := l.Info(); err == nil {
				st.ReadProgramID = info.Program
				if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
					if pi, err := p.Info(); err == nil && readerHooks[pi.Name] != "" {
						st.ReadCounter = readerHooks[pi.Name]
					}
					p.Close()
				}
			}
			l.Close()
		}
	}
	pods, err := set.readPods()
	if err != nil {
		return st, err
	}
	for _, p := range sortedKeys(pods) {
		if pods[p]&addrExclude == 0 {
			st.LocalPod = append(st.LocalPod, p)
		}
	}
	return st, nil
}
