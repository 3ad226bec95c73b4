package tc

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/hostaccel/hostaccel/internal/bpfobj"
)

// OpenAddrTrie opens the address trie of the running tc program id (`hostaccel status`'s
// programID) that holds the prefixes of p's family, for tools and tests that look at or
// change a running datapath's map behind its back; AddrKey is p's key in it. It returns nil
// and no error while there is no such program.
func OpenAddrTrie(id ebpf.ProgramID, p netip.Prefix) (*ebpf.Map, error) {
	name := fastpathMapAddrs4
	if p.Addr().Is6() {
		name = fastpathMapAddrs6
	}
	var m *ebpf.Map
	prog, err := bpfobj.Open(id, progName, map[string]**ebpf.Map{name: &m})
	if prog == nil || err != nil {
		return nil, err
	}
	prog.Close()
	if m == nil {
		return nil, fmt.Errorf("program %d has no map %s", id, name)
	}
	return m, nil
}

// AddrKey is p's key in the address trie of its family.
func AddrKey(p netip.Prefix) any { return lpmKey(p) }
