package tc

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// OpenAddrTrie opens the address trie of the running tc program id (`hostaccel status`'s
// programID) that holds the prefixes of p's family, for tools and tests that look at or
// change a running datapath's map behind its back; AddrKey is p's key in it. It returns nil
// and no error while there is no such program.
func OpenAddrTrie(id ebpf.ProgramID, p netip.Prefix) (*ebpf.Map, error) {
	s, err := openSet(id)
	if s == nil || err != nil {
		return nil, err
	}
	defer s.Close()
	m := s.addrMap(p)
	if m == nil {
		return nil, fmt.Errorf("program %d has no address trie of its family (another build)", id)
	}
	return m.Clone()
}

// AddrKey is p's key in the address trie of its family.
func AddrKey(p netip.Prefix) any { return lpmKey(p) }
