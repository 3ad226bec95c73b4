package testbed

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// A kube-proxy-like Node for a Topo: a ClusterIP (ports ClusterIPPort and ClusterIPPort+1) DNAT-ed in the host stack to the remote Pod
// (its replies come back over the transport, toward the local Pod), and a NodePort on the
// Node's transport address DNAT-ed without SNAT to the local Pod (externalTrafficPolicy:
// Local; its replies leave over the gateway, from the local Pod to the peer node).
const (
	ClusterIPPort = 8080
	NodePort      = 30080
)

// ClusterIP returns the Service address of the family.
func ClusterIP(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr("fd00:10:96::10")
	}
	return netip.MustParseAddr("10.96.0.10")
}

// KubeProxyRules is the nft script of those DNAT rules (tables ip/ip6 hostaccel-test-kp).
func (t *Topo) KubeProxyRules() string {
	var b strings.Builder
	for _, v6 := range []bool{false, true} {
		a, fam := t.Addrs(v6), "ip"
		if v6 {
			fam = "ip6"
		}
		fmt.Fprintf(&b, `table %[1]s hostaccel-test-kp {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		%[1]s daddr %[2]s meta l4proto { tcp, udp } th dport { %[3]d, %[8]d } dnat %[1]s to %[4]s
		%[1]s daddr %[5]s tcp dport %[6]d dnat %[1]s to %[7]s
	}
}
`, fam, ClusterIP(v6), ClusterIPPort, a.RemotePod, a.Node, NodePort, a.Pod, ClusterIPPort+1)
	}
	return b.String()
}

// NFT loads an nft script in the namespace.
func (n *NS) NFT(script string) error {
	f, err := os.CreateTemp("", "hostaccel-*.nft")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(script); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = n.Exec("nft", "-f", filepath.Clean(f.Name()))
	return err
}

// Exchange moves 64 KiB each way over TCP, and with udp 20 UDP echoes, between a client in from
// (bound to src) and a server in to listening on listen, dialled as dial: through a ClusterIP
// or a NodePort of KubeProxyRules, for example.
func Exchange(from, to *NS, src netip.Addr, listen, dial netip.AddrPort, udp bool) error {
	srv, err := to.ListenTCP(listen.String())
	if err != nil {
		return err
	}
	defer srv.Close()
	c, err := from.DialTCP(src.String(), dial.String())
	if err != nil {
		return err
	}
	err = Transfer(c, 64<<10, 16<<10)
	c.Close()
	if err != nil || !udp {
		return err
	}
	us, err := to.ListenUDP(listen.String())
	if err != nil {
		return err
	}
	defer us.Close()
	uc, err := from.DialUDP(src.String(), dial.String())
	if err != nil {
		return err
	}
	defer uc.Close()
	return Transfer(uc, 20*100, 100)
}
