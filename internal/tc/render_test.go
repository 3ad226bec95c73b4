package tc

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/model"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func node() model.State {
	s := model.State{
		Datapath:      model.DatapathTC,
		Gateways:      []string{"antrea-gw0"},
		Transports:    []string{"eth0", "eth1"},
		LocalPodCIDRs: prefixes("10.244.1.5/24", "fd00:10:244:1::/64"),
		PeerPodCIDRs:  prefixes("10.244.2.0/24", "10.244.0.0/24", "10.244.2.0/24", "fd00:10:244:2::/64"),
		PeerNodeIPs:   []netip.Addr{netip.MustParseAddr("172.18.0.3"), netip.MustParseAddr("fd00:172:18::3")},
		Exclude:       prefixes("10.244.2.66/32"),
		Classes:       []model.Class{model.PodToPod, model.NodeToRemotePod},
	}
	return s
}

func TestRender(t *testing.T) {
	d, err := Render(node())
	if err != nil {
		t.Fatal(err)
	}
	want := &Desired{
		Devices:  map[string]Role{"antrea-gw0": RoleGateway, "eth0": RoleTransport, "eth1": RoleTransport},
		LocalPod: prefixes("10.244.1.0/24", "fd00:10:244:1::/64"),
		PeerPod:  prefixes("10.244.0.0/24", "10.244.2.0/24", "fd00:10:244:2::/64"),
		PeerNode: prefixes("172.18.0.3/32", "fd00:172:18::3/128"),
		Exclude:  prefixes("10.244.2.66/32"),
		Classes:  []model.Class{model.PodToPod, model.NodeToRemotePod},
		NATCheck: model.NATCheckBoth,
		NATCarry: true,
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("Render =\n%+v\nwant\n%+v", d, want)
	}
	if got := classBits(d.Classes); got != 0b11 {
		t.Errorf("class bits = %b, want 11", got)
	}
	s := node()
	s.Classes = []model.Class{model.NodeToRemotePod}
	if d, err := Render(s); err != nil || classBits(d.Classes) != 0b10 {
		t.Errorf("node-to-remote-pod only: bits %b, err %v; want 10", classBits(d.Classes), err)
	}
	s.TCNoNATCarry = true // tc.natCarry: false
	if d, err := Render(s); err != nil || d.NATCarry {
		t.Errorf("tc.natCarry false: NATCarry %v, err %v", d.NATCarry, err)
	}
}

func TestRenderErrors(t *testing.T) {
	// Classes tc does not serve are left to the plan (config validation refuses them for
	// datapath tc); Render serves only its own.
	s := node()
	s.Classes = append([]model.Class{}, model.Classes...)
	if d, err := Render(s); err != nil || !slices.Equal(d.Classes, Supported) {
		t.Errorf("Render with every class = %v, %v; want %v", d, err, Supported)
	}

	s = node()
	s.Transports = append(s.Transports, "antrea-gw0")
	if _, err := Render(s); err == nil || !strings.Contains(err.Error(), `"antrea-gw0" is both a gateway and a transport`) {
		t.Errorf("device in both roles: err = %v", err)
	}
}

func TestRoleText(t *testing.T) {
	for _, r := range []Role{RoleGateway, RoleTransport} {
		b, _ := r.MarshalText()
		var back Role
		if err := back.UnmarshalText(b); err != nil || back != r {
			t.Errorf("%v -> %s -> %v, %v", r, b, back, err)
		}
	}
	var r Role
	if err := r.UnmarshalText([]byte("router")); err == nil {
		t.Error("accepted an unknown role")
	}
}
