package datapath

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/tc"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// failingNFT fails every transaction, as a kernel that refuses one would.
type failingNFT struct{ knftables.Interface }

func (failingNFT) Run(context.Context, *knftables.Transaction) error {
	return errors.New("netlink: Error: Could not process rule: No such file or directory")
}

// A plan's datapath that fails after another of the plan's went in: the error says which
// were applied. The tc datapath is applied first and stays attached; the flowtable's
// transaction (refused: a fake nft, whatever this kernel has) then says "nothing was
// changed", and before, that was all `apply` and the agent said (found by a review). The
// same for a plan whose sockmap datapath has no manager, and for a removal of the datapath
// the plan no longer has that fails after the plan's went in.
func TestFailedApplySaysWhichDatapathsWereApplied(t *testing.T) {
	testbed.RequireRoot(t)
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	var caps probe.Result
	topo.Node.Do(func() error { caps = probe.Run(context.Background()); return nil })
	if !caps.Has(probe.ClsBPF) && !caps.Has(probe.TCX) {
		t.Skip("needs the tc datapath")
	}
	var local, peer []netip.Prefix
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		local, peer = append(local, a.PodCIDR), append(peer, a.RemotePodCIDR)
	}
	s := model.State{Datapath: model.DatapathAuto, Gateways: []string{topo.GatewayName}, Transports: []string{topo.TransportName},
		LocalPodCIDRs: local, PeerPodCIDRs: peer, TCNATCheck: model.NATCheckOff}
	tcState, ftState := s, s
	tcState.Classes, ftState.Classes = []model.Class{model.PodToPod}, []model.Class{model.PodToService}

	for _, c := range []struct {
		name  string
		setup func(*Managers) error // before the Apply checked, with its managers
		plan  Plan
		want  []string
	}{
		{name: "flowtable transaction fails", plan: Plan{TC: &tcState, Flowtable: &ftState},
			setup: func(m *Managers) error { m.Flowtable.NFT = failingNFT{m.Flowtable.NFT}; return nil },
			want:  []string{"nothing was changed", "(the tc datapath was applied)"}},
		{name: "no sockmap manager", plan: Plan{TC: &tcState, Sockmap: &s},
			want: []string{"no manager for it", "(the tc datapath was applied; the datapaths the plan no longer has were kept)"}},
		{name: "removal of the flowtable fails", plan: Plan{TC: &tcState},
			setup: func(m *Managers) error {
				if _, err := m.Apply(context.Background(), Plan{Flowtable: &ftState}, caps); err != nil {
					return err
				}
				m.Flowtable.NFT = failingNFT{m.Flowtable.NFT}
				return nil
			},
			want: []string{"Could not process rule", "(the tc datapath was applied)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ft, _ := flowtable.NewFakeManager()
			m := &Managers{TC: tc.NewManager(), Flowtable: ft}
			t.Cleanup(func() { topo.Node.Do(func() error { return m.TC.Remove(context.Background()) }) })
			var err error
			var res Result
			var st tc.Status
			if serr := topo.Node.Do(func() error {
				if c.setup != nil {
					if err := c.setup(m); err != nil {
						return err
					}
				}
				res, err = m.Apply(context.Background(), c.plan, caps)
				st, _ = tc.NewManager().Status(context.Background())
				return nil
			}); serr != nil {
				t.Fatalf("setup: %v", serr)
			}
			if err == nil {
				t.Fatal("the apply succeeded")
			}
			t.Logf("error: %v", err)
			if st.ProgramID == 0 || res.TC == nil || !res.Changed() {
				t.Fatalf("the tc datapath is not attached (status %+v, result %+v): this test shows nothing", st, res.TC)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the apply failed with %q after the tc datapath was attached (program %d); want it to say %q", err, st.ProgramID, w)
				}
			}
		})
	}
}

func TestAppliedNote(t *testing.T) {
	for names, want := range map[string]string{
		"tc":                   "the tc datapath was applied",
		"tc sockmap":           "the tc and sockmap datapaths were applied",
		"tc sockmap flowtable": "the tc, sockmap and flowtable datapaths were applied",
	} {
		if got := appliedNote(strings.Fields(names)); got != want {
			t.Errorf("appliedNote(%s) = %q, want %q", names, got, want)
		}
	}
}
