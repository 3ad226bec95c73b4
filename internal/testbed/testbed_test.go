package testbed_test

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"
	"github.com/vishvananda/netlink"
)

func TestNS(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	a, err := testbed.NewNS("a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := testbed.NewNS("b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	if !strings.HasPrefix(a.Name, testbed.NamePrefix()) || a.Name == b.Name {
		t.Errorf("names %q, %q: want distinct, prefix %q", a.Name, b.Name, testbed.NamePrefix())
	}
	if err := a.Sysctl("net.ipv4.ip_default_ttl", "42"); err != nil {
		t.Fatal(err)
	}
	if out, err := a.Exec("cat", "/proc/sys/net/ipv4/ip_default_ttl"); err != nil || strings.TrimSpace(out) != "42" {
		t.Errorf("ttl in ns = %q, %v; want 42", out, err)
	}
	if root, _ := os.ReadFile("/proc/sys/net/ipv4/ip_default_ttl"); strings.TrimSpace(string(root)) == "42" {
		t.Error("Sysctl leaked into the root namespace")
	}
	if _, err := a.Exec("false"); err == nil {
		t.Error("Exec(false) succeeded")
	}

	if err := testbed.Veth(a, "va", b, "vb"); err != nil {
		t.Fatal(err)
	}
	pa, pb := netip.MustParsePrefix("fd00:99::1/64"), netip.MustParsePrefix("fd00:99::2/64")
	if err := a.AddrAdd("va", pa); err != nil {
		t.Fatal(err)
	}
	if err := b.AddrAdd("vb", pb); err != nil {
		t.Fatal(err)
	}
	srv, err := b.ListenTCP("[" + pb.Addr().String() + "]:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.DialTCP(pa.Addr().String(), srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := testbed.Transfer(c, 1<<20, 32<<10); err != nil {
		t.Fatal(err)
	}
	if got := srv.Bytes(); got != 1<<20 {
		t.Errorf("server got %d bytes, want %d", got, 1<<20)
	}
	if p := srv.Peers(); len(p) != 1 || p[0] != pa.Addr() {
		t.Errorf("peers = %v, want [%v]", p, pa.Addr())
	}
	h, err := a.Handle()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinkByName("va"); err != nil {
		t.Errorf("handle: %v", err)
	}
	if _, err := netlink.LinkByName("va"); err == nil {
		t.Error("veth end visible in root namespace")
	}

	// Close tears down the server too; a second Close is a no-op.
	c.Close()
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	if err := b.Close(); err != nil {
		t.Error(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	testbed.CheckNoLeaks(t, testbed.NamePrefix(), before)
}

func TestTopoTraffic(t *testing.T) {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	const n, chunk = 4 << 20, 16 << 10

	for _, v6 := range []bool{false, true} {
		a := topo.Addrs(v6)
		fam := map[bool]string{false: "v4", true: "v6"}[v6]
		cases := []struct {
			name           string
			client, server *testbed.NS
			src, dst       netip.Addr
		}{
			{"PodToRemotePod", topo.Pod, topo.Remote, a.Pod, a.RemotePod},
			{"ExternalToPod", topo.Remote, topo.Pod, a.External, a.Pod},
			{"RemotePodToPod", topo.Remote, topo.Pod, a.RemotePod, a.Pod},
		}
		for _, tc := range cases {
			t.Run(fam+"/TCP/"+tc.name, func(t *testing.T) {
				srv, err := tc.server.ListenTCP(netip.AddrPortFrom(tc.dst, 0).String())
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				c, err := tc.client.DialTCP(tc.src.String(), srv.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := testbed.Transfer(c, n, chunk); err != nil {
					t.Fatal(err)
				}
				if got := srv.Bytes(); got != n {
					t.Errorf("server received %d bytes, want %d", got, n)
				}
				if p := srv.Peers(); len(p) != 1 || p[0] != tc.src {
					t.Errorf("server saw peers %v, want [%v] (no NAT)", p, tc.src)
				}
			})
			t.Run(fam+"/UDP/"+tc.name, func(t *testing.T) {
				const n, chunk = 1 << 20, 1200
				srv, err := tc.server.ListenUDP(netip.AddrPortFrom(tc.dst, 0).String())
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				c, err := tc.client.DialUDP(tc.src.String(), srv.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := testbed.Transfer(c, n, chunk); err != nil {
					t.Fatal(err)
				}
				if got, want := srv.Packets(), int64((n+chunk-1)/chunk); srv.Bytes() != n || got != want {
					t.Errorf("server received %d bytes in %d packets, want %d in %d", srv.Bytes(), got, n, want)
				}
				if p := srv.Peers(); len(p) != 1 || p[0] != tc.src {
					t.Errorf("server saw peers %v, want [%v] (no NAT)", p, tc.src)
				}
			})
		}
	}
}

func TestTopoExtraTransport(t *testing.T) {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{
		GatewayName:    "antrea-gw0",
		TransportName:  "ens3",
		ExtraTransport: true,
	})
	h, err := topo.Node.Handle()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"antrea-gw0", "ens3", "eth1"} {
		if _, err := h.LinkByName(name); err != nil {
			t.Errorf("Node link %s: %v", name, err)
		}
	}
	for _, v6 := range []bool{false, true} {
		a := topo.Addrs(v6)
		srv, err := topo.Pod.ListenTCP(netip.AddrPortFrom(a.Pod, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := topo.Remote2.DialTCP("", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.Transfer(c, 1<<20, 64<<10); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if srv.Bytes() != 1<<20 || !slices.Equal(srv.Peers(), []netip.Addr{a.Remote2}) {
			t.Errorf("v6=%v: server got %d bytes from %v, want %d from %v", v6, srv.Bytes(), srv.Peers(), 1<<20, a.Remote2)
		}
		srv.Close()
	}
}

func TestTopoClose(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	topo, err := testbed.NewTopo(testbed.TopoOptions{ExtraTransport: true})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{topo.Pod.Name, topo.Node.Name, topo.Remote.Name, topo.Remote2.Name}
	if got := testbed.Namespaces(t, testbed.NamePrefix()); len(got) != 4 {
		t.Errorf("namespaces while up = %v, want %v", got, names)
	}
	// A server left open must not block teardown.
	if _, err := topo.Pod.ListenTCP(":0"); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	testbed.CheckNoLeaks(t, testbed.NamePrefix(), before)
}

func TestTopoHalfBuilt(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	for _, opts := range []testbed.TopoOptions{
		{TransportName: "name-longer-than-15"},             // fails at the second veth
		{ExtraTransport: true, Transport2Name: "bad/name"}, // fails at the third veth
		{GatewayName: "same", TransportName: "same"},       // duplicate link name
		{ExtraTransport: true, Transport2Name: "lo"},       // existing link
	} {
		topo, err := testbed.NewTopo(opts)
		if err == nil {
			t.Errorf("NewTopo(%+v) succeeded, want error", opts)
			topo.Close()
		} else {
			t.Logf("NewTopo(%+v): %v", opts, err)
		}
		testbed.CheckNoLeaks(t, testbed.NamePrefix(), before)
	}
}
