package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A new user's first try on a kube-proxy node (issue 10): datapath auto with only pod-to-pod,
// while the host stack DNATs a ClusterIP to the remote Pod and a NodePort (no SNAT) to the
// local Pod. auto puts pod-to-pod on tc, whose NAT check hands those connections to the stack:
// all of them work, and pure pod-to-pod traffic is still redirected.
func TestAutoOnKubeProxyNode(t *testing.T) {
	needTC(t)
	if !caps.Has(probe.ConntrackKfuncs) {
		t.Fatalf("this kernel lacks the conntrack kfuncs (probe: %s); both test kernels have them", caps.Get(probe.ConntrackKfuncs).Detail)
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	if err := tp.Node.NFT(tp.KubeProxyRules()); err != nil {
		t.Fatal(err)
	}
	old := testbed.IOTimeout
	testbed.IOTimeout = 3 * time.Second
	t.Cleanup(func() { testbed.IOTimeout = old })

	out := mustHA(t, tp.Node.Name, "apply", "-f", writeConfig(t, nodeConfig(tp, "datapath: auto\n"+podToPod)))
	if !strings.Contains(out, "applied tc datapath") {
		t.Fatalf("auto did not choose tc for pod-to-pod:\n%s", out)
	}
	t.Cleanup(func() { ha(tp.Node.Name, "cleanup") })

	before := tcStatus(t, tp.Node).TC.Passed["nat"].Packets
	for _, v6 := range []bool{false, true} {
		a := tp.Addrs(v6)
		if err := testbed.Exchange(tp.Pod, tp.Remote, a.Pod, netip.AddrPortFrom(a.RemotePod, testbed.ClusterIPPort), netip.AddrPortFrom(testbed.ClusterIP(v6), testbed.ClusterIPPort), false); err != nil {
			t.Errorf("v6=%v: Pod -> ClusterIP -> remote Pod over TCP: %v", v6, err)
		}
		if err := testbed.Exchange(tp.Remote, tp.Pod, a.Remote, netip.AddrPortFrom(a.Pod, testbed.NodePort), netip.AddrPortFrom(a.Node, testbed.NodePort), false); err != nil {
			t.Errorf("v6=%v: peer node -> NodePort -> local Pod over TCP: %v", v6, err)
		}
	}
	a := tp.V4
	us, err := tp.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, testbed.ClusterIPPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer us.Close()
	uc, err := tp.Pod.DialUDP("", netip.AddrPortFrom(testbed.ClusterIP(false), testbed.ClusterIPPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if err := testbed.Transfer(uc, 20*100, 100); err != nil {
		t.Errorf("Pod -> ClusterIP -> remote Pod over UDP: %v", err)
	}
	st := tcStatus(t, tp.Node)
	if n := st.TC.Passed["nat"].Packets - before; n < 20 {
		t.Errorf("%d packets handed to the stack as NAT-ed, want >= 20", n)
	}
	if st.TC.NATCheck != "both" {
		t.Errorf("status NAT check %q, want both", st.TC.NATCheck)
	}

	// Pure pod-to-pod: redirected, not handed to the stack.
	p2p := st.TC.Class("pod-to-pod").Packets
	if err := reachable(tp, tp.V4, 5120); err != nil {
		t.Fatal(err)
	}
	st2 := tcStatus(t, tp.Node)
	if st2.TC.Class("pod-to-pod").Packets-p2p < 20 || st2.TC.Passed["nat"] != st.TC.Passed["nat"] {
		t.Errorf("pod-to-pod: %d redirected, nat %d -> %d; want >= 20 and unchanged",
			st2.TC.Class("pod-to-pod").Packets-p2p, st.TC.Passed["nat"].Packets, st2.TC.Passed["nat"].Packets)
	}
}
