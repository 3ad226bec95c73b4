package tc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// openClusterIP opens a ClusterIP connection Pod -> RemotePod (no t.Fatal: callable from
// the goroutine Apply runs on).
func openClusterIP(e *env, ln net.Listener) (client, server net.Conn, err error) {
	a := e.topo.Addrs(false)
	acc := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			acc <- c
		}
	}()
	client, err = e.topo.Pod.DialTCP(a.Pod.String(), netip.AddrPortFrom(testbed.ClusterIP(false), testbed.ClusterIPPort+1).String())
	if err != nil {
		return nil, nil, err
	}
	select {
	case server = <-acc:
		return client, server, nil
	case <-time.After(3 * time.Second):
		return client, nil, errors.New("not accepted")
	}
}

// reply writes from server and reads on client within d.
func reply(client, server net.Conn, d time.Duration) error {
	go server.Write([]byte("reply"))
	client.SetReadDeadline(time.Now().Add(d))
	_, err := io.ReadFull(client, make([]byte, 5))
	return err
}

// Windows of an Apply in which a NAT-ed reply was redirected past its un-NAT (found by a
// helper's review; each test fails on the code before the fix): while a set is attached to
// devices that lack it, every mark counts in it and in the older sets (handed_since 0), until
// conntrack has been listed after the attachments; a device whose attach fails is no redirect
// target.

// A fresh set is attached device by device ("eth0" before "gw"). A ClusterIP connection
// opened after Apply's first conntrack listing (here: while the set is attached) has no mark
// in the fresh set until the second listing, after the last attachment. A reply that reaches
// the already-attached transport in between is redirected past the un-DNAT: the client
// answers the backend's address with a RST and the connection is dead for good.
func TestFreshSetReplyBetweenAttachments(t *testing.T) {
	t.Run("reply in the window", func(t *testing.T) { freshReplyBetweenAttachments(t, true) })
	t.Run("control: reply only after the Apply", func(t *testing.T) { freshReplyBetweenAttachments(t, false) })
}

func freshReplyBetweenAttachments(t *testing.T, inWindow bool) {
	e := newNATEnv(t)
	ln := clusterIPBackend(t, e, false)
	defer ln.Close()
	var client, server net.Conn
	var openErr, windowErr error
	sawWindow := false
	orig := attachProgram
	defer func() { attachProgram = orig }()
	attachProgram = func(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
		switch l.Attrs().Name {
		case e.topo.TransportName:
			// before the first attachment: the connection is opened through the stack,
			// after the fresh set's first listing of conntrack
			client, server, openErr = openClusterIP(e, ln)
		case e.topo.GatewayName:
			// the transport has the fresh set, the gateway not yet
			if server != nil {
				sawWindow = true
			}
			if server != nil && inWindow {
				windowErr = reply(client, server, time.Second)
			}
		}
		return orig(mode, l, set, mine, sets)
	}
	res := e.apply()
	attachProgram = orig
	if openErr != nil {
		t.Fatalf("open: %v", openErr)
	}
	defer client.Close()
	defer server.Close()
	if !res.Loaded || !sawWindow {
		t.Fatalf("loaded %v, window seen %v", res.Loaded, sawWindow)
	}
	after := reply(client, server, time.Second)
	st := e.status()
	t.Logf("status after: pod-to-pod ipv4 %+v, nat %+v", st.family(model.PodToPod, "ipv4"), st.Passed[PassNAT])
	if windowErr != nil || after != nil {
		t.Errorf("ClusterIP connection opened during a fresh set's Apply: reply while the transport had the set and the gateway not: %v; reply after the Apply: %v", windowErr, after)
	}
}

// A device added to a live set (a new Pod's veth: here the gateway, left out of the first
// Apply) gets no listing of conntrack: a ClusterIP connection its Pod opened before (through the
// stack) is never remembered, and once the device is attached and in ifaces, its replies are
// redirected past the un-DNAT.
func TestDeviceAddedToLiveSet(t *testing.T) {
	e := newNATEnv(t)
	gw := e.topo.GatewayName
	role := e.d.Devices[gw]
	delete(e.d.Devices, gw)
	if res := e.apply(); !res.Loaded {
		t.Fatalf("want a fresh set: %+v", res)
	}
	ln := clusterIPBackend(t, e, false)
	defer ln.Close()
	client, server, err := openClusterIP(e, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	defer server.Close()
	if err := reply(client, server, time.Second); err != nil {
		t.Fatalf("before the gateway is added: %v", err)
	}
	e.d.Devices[gw] = role
	res := e.apply()
	if res.Loaded {
		t.Fatalf("want the live set updated: %+v", res)
	}
	before := e.status()
	err = reply(client, server, time.Second)
	st := e.status()
	t.Logf("pod-to-pod ipv4 redirected during the reply: %d packets", st.family(model.PodToPod, "ipv4").Packets-before.family(model.PodToPod, "ipv4").Packets)
	if err != nil {
		t.Errorf("ClusterIP connection opened before its Pod's device joined the live set: reply after the Apply: %v (status: %s)", err, fmt.Sprint(st.Passed[PassNAT]))
	}
}

// The same the other way round, in an upgrade (an older set attached, replaced device by device):
// a NodePort connection from a peer node whose SYN passes the fresh set (on the transport,
// replaced first) is remembered by the fresh set only; its SYN-ACK from the local backend Pod
// passes the older set, still on the gateway, which never learns the end (no listing writes
// the older set): redirected past the un-DNAT. Until the gateway is switched, every such
// connection fails its handshake.
func TestUpgradeReplyThroughOlderSet(t *testing.T) {
	e := newNATEnv(t)
	first := e.apply()
	e.do(func() error { // an older build: same contents, another build hash
		s, err := openSet(first.ProgramID)
		if err != nil {
			return err
		}
		defer s.Close()
		var cfg fastpathSettings
		if err := s.settings.Lookup(uint32(0), &cfg); err != nil {
			return err
		}
		cfg.Build = 1
		return s.settings.Put(uint32(0), cfg)
	})
	a := e.topo.Addrs(false)
	var ln net.Listener
	if err := e.topo.Pod.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(a.Pod, testbed.NodePort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	dial := func() error {
		return e.topo.Remote.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: a.Remote.AsSlice()}, Timeout: 500 * time.Millisecond}
			c, err := d.Dial("tcp", netip.AddrPortFrom(a.Node, testbed.NodePort).String())
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial(); err != nil {
		t.Fatalf("before the upgrade: %v", err)
	}
	var windowErr error
	saw := false
	orig := attachProgram
	defer func() { attachProgram = orig }()
	attachProgram = func(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
		if l.Attrs().Name == e.topo.GatewayName { // the transport has the fresh set, the gateway the older one
			saw = true
			old := sets[mine[0].prog]
			b, _ := old.counters()
			windowErr = dial()
			c, _ := old.counters()
			t.Logf("older set on %s while the dial ran: node-to-remote-pod ipv4 redirected %d packets, nat %d", l.Attrs().Name,
				c[2*1].Packets-b[2*1].Packets, c[stat(PassNAT)].Packets-b[stat(PassNAT)].Packets)
		}
		return orig(mode, l, set, mine, sets)
	}
	res := e.apply()
	attachProgram = orig
	if !res.Loaded || !saw {
		t.Fatalf("loaded %v, window seen %v", res.Loaded, saw)
	}
	after := dial()
	if windowErr != nil || after != nil {
		t.Errorf("NodePort connection from a peer node during an upgrade, transport switched, gateway not: %v; after the Apply: %v", windowErr, after)
	}
}

// An attach that fails leaves the device in ifaces (a redirect target) with no program on
// it: its Pods' SYNs to a ClusterIP are remembered by nothing, and the replies arriving on the
// transport are redirected into it past the un-DNAT, until an attach succeeds.
func TestFailedAttachLeavesNoRedirectTarget(t *testing.T) {
	e := newNATEnv(t)
	orig := attachProgram
	defer func() { attachProgram = orig }()
	attachProgram = func(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
		if l.Attrs().Name == e.topo.GatewayName {
			return attachment{}, errors.New("test: attach fails")
		}
		return orig(mode, l, set, mine, sets)
	}
	var applyErr error
	e.do(func() error {
		e.m.Mode = e.mode
		_, applyErr = e.m.Apply(t.Context(), e.d)
		return nil
	})
	attachProgram = orig
	if applyErr == nil {
		t.Fatal("want the apply to fail on the gateway")
	}
	ln := clusterIPBackend(t, e, false)
	defer ln.Close()
	client, server, err := openClusterIP(e, ln)
	if err != nil {
		t.Fatalf("ClusterIP connection while the gateway has no program (its attach failed): %v", err)
	}
	defer client.Close()
	defer server.Close()
	if err := reply(client, server, time.Second); err != nil {
		t.Errorf("ClusterIP connection while the gateway's attach failed: reply: %v (apply error: %v)", err, applyErr)
	}
}
