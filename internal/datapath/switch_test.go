package datapath

import (
	"context"
	"net/netip"
	"testing"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// A switch of datapath whose new one the kernel refuses keeps the old one: make before break.
// On a kernel without the nftables flowtable (this host) a plan moving the node from tc to
// the flowtable fails at the flowtable's transaction, and the tc program stays attached.
// Before (a review), tc was removed first and the node was left with neither, while the error
// said the flowtable's transaction had changed nothing. (The plan is given directly: `apply`
// and the agent refuse a plan the probe says cannot run before they get here; a transaction
// can still fail, a device vanishing meanwhile, say.)
func TestSwitchKeepsTheOldDatapathWhenTheNewFails(t *testing.T) {
	testbed.RequireRoot(t)
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	var caps probe.Result
	topo.Node.Do(func() error { caps = probe.Run(context.Background()); return nil })
	if caps.Has(probe.Flowtable) || !caps.Has(probe.ClsBPF) && !caps.Has(probe.TCX) {
		t.Skip("needs tc and a kernel without the flowtable (whose transaction then fails)")
	}
	var local, peer []netip.Prefix
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		local, peer = append(local, a.PodCIDR), append(peer, a.RemotePodCIDR)
	}
	s := model.State{Gateways: []string{topo.GatewayName}, Transports: []string{topo.TransportName},
		LocalPodCIDRs: local, PeerPodCIDRs: peer, Classes: []model.Class{model.PodToPod}}
	tcState, ftState := s, s
	tcState.Datapath, ftState.Datapath = model.DatapathTC, model.DatapathFlowtable
	m := &Managers{TC: tc.NewManager(), Flowtable: flowtable.NewManager()}
	t.Cleanup(func() { topo.Node.Do(func() error { return m.Remove(context.Background()) }) })
	var err error
	var st tc.Status
	topo.Node.Do(func() error {
		if _, err = m.Apply(context.Background(), Plan{TC: &tcState}, caps); err != nil {
			return nil
		}
		_, err = m.Apply(context.Background(), Plan{Flowtable: &ftState}, caps)
		st, _ = tc.NewManager().Status(context.Background())
		return nil
	})
	if err == nil {
		t.Fatal("the flowtable's transaction succeeded on a kernel the probe says lacks it")
	}
	t.Logf("switch: %v", err)
	if st.ProgramID == 0 {
		t.Errorf("the failed switch removed the tc datapath (status %+v)", st)
	}
}
