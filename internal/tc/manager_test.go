package tc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// env is a testbed topology with the tc datapath managed in its Node namespace.
type env struct {
	t    *testing.T
	topo *testbed.Topo
	mode Mode
	d    *Desired
	m    *Manager // the agent's: one for every apply
}

func newEnv(t *testing.T, mode Mode) *env {
	topo := testbed.NewTopoT(t, testbed.TopoOptions{})
	var local, peer []netip.Prefix
	var nodes []netip.Addr
	for _, a := range []testbed.Addrs{topo.V4, topo.V6} {
		local = append(local, a.PodCIDR)
		peer = append(peer, a.RemotePodCIDR)
		nodes = append(nodes, a.Remote)
	}
	d, err := Render(model.State{
		Datapath:      model.DatapathTC,
		Gateways:      []string{topo.GatewayName},
		Transports:    []string{topo.TransportName},
		LocalPodCIDRs: local,
		PeerPodCIDRs:  peer,
		PeerNodeIPs:   nodes,
		Classes:       Supported,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, topo: topo, mode: mode, d: d, m: &Manager{Mode: mode}}
	t.Cleanup(func() { e.do(func() error { return NewManager().Remove(context.Background()) }) })
	return e
}

// do runs fn in the Node namespace.
func (e *env) do(fn func() error) {
	e.t.Helper()
	if err := e.topo.Node.Do(fn); err != nil {
		e.t.Fatal(err)
	}
}

// onSet runs fn on the program set attached in the Node namespace, opened as another process
// would.
func (e *env) onSet(fn func(s *progSet) error) {
	e.t.Helper()
	e.do(func() error {
		s, err := openSet(e.status().ProgramID)
		if err != nil {
			return err
		}
		defer s.Close()
		return fn(s)
	})
}

func (e *env) apply() Result {
	e.t.Helper()
	var res Result
	e.do(func() (err error) {
		e.m.Mode = e.mode
		res, err = e.m.Apply(context.Background(), e.d)
		return err
	})
	return res
}

// status reads the status with a fresh Manager, as another process would.
func (e *env) status() Status {
	e.t.Helper()
	var st Status
	e.do(func() (err error) {
		st, err = NewManager().Status(context.Background())
		return err
	})
	return st
}

func (e *env) forwarding(on bool) {
	e.t.Helper()
	v := map[bool]string{false: "0", true: "1"}[on]
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := e.topo.Node.Sysctl(k, v); err != nil {
			e.t.Fatal(err)
		}
	}
}

func fam(v6 bool) string { return map[bool]string{false: "ipv4", true: "ipv6"}[v6] }

func (s Status) family(c model.Class, family string) Counter {
	for _, cc := range s.Classes {
		if cc.Class == c && cc.Family == family {
			return cc.Counter
		}
	}
	return Counter{}
}

func (s Status) total() Counter {
	var sum Counter
	for _, cc := range s.Classes {
		sum.Packets += cc.Packets
		sum.Bytes += cc.Bytes
	}
	return sum
}

// tcp moves 1 MiB each way from a client in from (bound to src) to a server on dst in to.
func tcp(from, to *testbed.NS, src, dst netip.Addr) error {
	srv, err := to.ListenTCP(netip.AddrPortFrom(dst, 0).String())
	if err != nil {
		return err
	}
	defer srv.Close()
	c, err := from.DialTCP(src.String(), srv.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if err := testbed.Transfer(c, 1<<20, 32<<10); err != nil {
		return err
	}
	if srv.Bytes() != 1<<20 {
		return fmt.Errorf("server got %d bytes, want %d", srv.Bytes(), 1<<20)
	}
	return nil
}

// udp sends n datagrams of 1200 bytes from the Pod to an echo server on the remote Pod and
// waits for each echo.
func udp(topo *testbed.Topo, v6 bool, n int) error {
	a := topo.Addrs(v6)
	srv, err := topo.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, 0).String())
	if err != nil {
		return err
	}
	defer srv.Close()
	c, err := topo.Pod.DialUDP(a.Pod.String(), srv.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if err := testbed.Transfer(c, n*1200, 1200); err != nil {
		return err
	}
	if srv.Packets() != int64(n) || !slices.Equal(srv.Peers(), []netip.Addr{a.Pod}) {
		return fmt.Errorf("echo server got %d datagrams from %v, want %d from %v", srv.Packets(), srv.Peers(), n, a.Pod)
	}
	return nil
}

// blocked fails unless a TCP connect and a UDP echo from the Pod to the remote Pod both fail.
func blocked(t *testing.T, topo *testbed.Topo, v6 bool) {
	t.Helper()
	a := topo.Addrs(v6)
	srv, err := topo.Remote.ListenTCP(netip.AddrPortFrom(a.RemotePod, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	err = topo.Pod.Do(func() error {
		c, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("%s: TCP pod -> remote pod connected; want it blocked", fam(v6))
	}
	us, err := topo.Remote.ListenUDP(netip.AddrPortFrom(a.RemotePod, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer us.Close()
	c, err := topo.Pod.DialUDP("", us.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("probe"))
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Read(make([]byte, 16)); err == nil {
		t.Errorf("%s: UDP echo pod -> remote pod answered; want it blocked", fam(v6))
	}
}

// flows checks TCP (1 MiB each way) and UDP (200 echoes) pod -> remote pod, IPv4 and IPv6,
// and that every packet of it was redirected as pod-to-pod.
func flows(t *testing.T, e *env) {
	t.Helper()
	for _, v6 := range []bool{false, true} {
		a := e.topo.Addrs(v6)
		before := e.status().family(model.PodToPod, fam(v6))
		if err := tcp(e.topo.Pod, e.topo.Remote, a.Pod, a.RemotePod); err != nil {
			t.Fatalf("%s TCP: %v", fam(v6), err)
		}
		mid := e.status().family(model.PodToPod, fam(v6))
		if err := udp(e.topo, v6, 200); err != nil {
			t.Fatalf("%s UDP: %v", fam(v6), err)
		}
		after := e.status().family(model.PodToPod, fam(v6))
		t.Logf("%s pod-to-pod redirected: TCP %d packets, %d bytes; UDP %d packets, %d bytes", fam(v6),
			mid.Packets-before.Packets, mid.Bytes-before.Bytes, after.Packets-mid.Packets, after.Bytes-mid.Bytes)
		if got := mid.Bytes - before.Bytes; got < 2<<20 {
			t.Errorf("%s TCP: %d bytes redirected, want >= %d (1 MiB each way)", fam(v6), got, 2<<20)
		}
		if got := after.Packets - mid.Packets; got < 400 {
			t.Errorf("%s UDP: %d packets redirected, want >= 400 (200 each way)", fam(v6), got)
		}
	}
}

// probe sends one UDP datagram from the Pod to the remote Pod and returns the TTL / hop
// limit the receiver saw (IP_RECVTTL / IPV6_RECVHOPLIMIT), and the frame as it arrived on
// Remote's eth0 (AF_PACKET capture).
func sendProbe(t *testing.T, topo *testbed.Topo, v6 bool) (ttl int, frame []byte, pkttype uint8) {
	t.Helper()
	a := topo.Addrs(v6)
	var rc *net.UDPConn
	var fd int
	err := topo.Remote.Do(func() error {
		var err error
		if rc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.RemotePod, 0))); err != nil {
			return err
		}
		raw, err := rc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = raw.Control(func(fd uintptr) {
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
			}
		})
		if err = errors.Join(err, serr); err != nil {
			return err
		}
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if rc != nil {
		defer rc.Close()
	}
	if fd > 0 {
		defer unix.Close(fd)
	}
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("hostaccel-probe")
	c, err := topo.Pod.DialUDP(a.Pod.String(), rc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}

	buf, oob := make([]byte, 64), make([]byte, 128)
	rc.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, oobn, _, _, err := rc.ReadMsgUDP(buf, oob)
	if err != nil || !bytes.Equal(buf[:n], payload) {
		t.Fatalf("%s probe not received: %q, %v", fam(v6), buf[:n], err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	ttl = -1
	for _, m := range msgs {
		if (m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL) || (m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_HOPLIMIT) {
			ttl = int(binary.NativeEndian.Uint32(m.Data))
		}
	}

	fb := make([]byte, 2048)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(fd, fb, 0)
		if err != nil {
			continue
		}
		f, ll := fb[:n], from.(*unix.SockaddrLinklayer)
		if ll.Pkttype != unix.PACKET_OUTGOING && bytes.HasSuffix(f, payload) && isTo(f, a.RemotePod) {
			return ttl, slices.Clone(f), ll.Pkttype
		}
	}
	t.Fatalf("%s probe frame not captured on Remote eth0", fam(v6))
	return
}

// isTo reports whether an Ethernet frame carries an IP packet to dst.
func isTo(f []byte, dst netip.Addr) bool {
	if dst.Is4() {
		return len(f) >= 34 && f[12] == 0x08 && f[13] == 0x00 && bytes.Equal(f[30:34], dst.AsSlice())
	}
	return len(f) >= 54 && f[12] == 0x86 && f[13] == 0xdd && bytes.Equal(f[38:54], dst.AsSlice())
}

// onTheWire checks the TTL / hop limit the remote Pod sees (64 - 1: one router) and the
// frame's MACs: Node eth0 -> Remote eth0, received as PACKET_HOST.
func onTheWire(t *testing.T, e *env) {
	t.Helper()
	src, dst := testbed.LinkT(t, e.topo.Node, e.topo.TransportName).HardwareAddr, testbed.LinkT(t, e.topo.Remote, "eth0").HardwareAddr
	for _, v6 := range []bool{false, true} {
		before := e.status().family(model.PodToPod, fam(v6))
		ttl, f, pkttype := sendProbe(t, e.topo, v6)
		if ttl != 63 {
			t.Errorf("%s: receiver saw TTL/hop limit %d, want 63", fam(v6), ttl)
		}
		wireTTL := f[22]
		if v6 {
			wireTTL = f[21]
		}
		if wireTTL != 63 {
			t.Errorf("%s: TTL/hop limit on the wire %d, want 63", fam(v6), wireTTL)
		}
		if !bytes.Equal(f[0:6], dst) || !bytes.Equal(f[6:12], src) || pkttype != unix.PACKET_HOST {
			t.Errorf("%s: frame %s -> %s (pkttype %d), want %s -> %s (host)", fam(v6), net.HardwareAddr(f[6:12]), net.HardwareAddr(f[0:6]), pkttype, src, dst)
		}
		if got := e.status().family(model.PodToPod, fam(v6)).Packets - before.Packets; got != 1 {
			t.Errorf("%s: probe redirected %d times, want 1", fam(v6), got)
		}
	}
}

// netSNMP reads a counter of the Node's /proc/net/snmp ("Ip" "ForwDatagrams") or snmp6.
func netSNMP(t *testing.T, ns *testbed.NS, v6 bool) uint64 {
	t.Helper()
	if v6 {
		out, err := ns.Exec("cat", "/proc/net/snmp6")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "Ip6OutForwDatagrams" {
				n, _ := strconv.ParseUint(f[1], 10, 64)
				return n
			}
		}
		t.Fatal("no Ip6OutForwDatagrams")
	}
	out, err := ns.Exec("cat", "/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) > 0 && names[0] == "Ip:" && len(vals) == len(names) {
			if j := slices.Index(names, "ForwDatagrams"); j > 0 {
				n, _ := strconv.ParseUint(vals[j], 10, 64)
				return n
			}
		}
	}
	t.Fatal("no Ip ForwDatagrams")
	return 0
}

// attachedTo lists the devices our program is on, by a fresh Manager's Status.
func attachedTo(st Status) []string {
	var names []string
	for _, d := range st.Devices {
		names = append(names, d.Name+"/"+string(d.Mode))
	}
	return names
}

// TestForwardingOff is the proof of bypass: with the Node's forwarding off, pod -> remote pod
// traffic flows only because the program redirects it. It also covers drift repair, an
// upgrade, device re-creation and cleanup, in both attach modes.
func TestForwardingOff(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeClsBPF} {
		t.Run(string(mode), func(t *testing.T) {
			needMode(t, mode)
			e := newEnv(t, mode)
			e.forwarding(false)
			for _, v6 := range []bool{false, true} {
				blocked(t, e.topo, v6)
			}

			res := e.apply()
			t.Logf("apply: %+v", res)
			if res.Mode != mode || !res.Loaded || !slices.Equal(res.Attached, []string{"eth0", "gw"}) || res.ElementsAdded != 10 || res.Drift != nil {
				// 2 devices, 6 address prefixes, the gateway's 2 addresses (the node's)
				t.Errorf("first apply = %+v; want mode %s, loaded, attached [eth0 gw], 10 elements added, no drift", res, mode)
			}
			if res := e.apply(); res.Loaded || len(res.Attached)+res.ElementsAdded+res.ElementsUpdated+res.ElementsRemoved > 0 || res.Drift != nil {
				t.Errorf("second apply changed something: %+v", res)
			}
			st := e.status()
			if st.Mode != mode || !slices.Equal(attachedTo(st), []string{"eth0/" + string(mode), "gw/" + string(mode)}) {
				t.Errorf("status: mode %q, devices %v", st.Mode, attachedTo(st))
			}
			for _, d := range st.Devices {
				if want := map[string]Role{"gw": RoleGateway, "eth0": RoleTransport}[d.Name]; d.Role != want {
					t.Errorf("device %s: role %v, want %v", d.Name, d.Role, want)
				}
			}

			flows(t, e)
			onTheWire(t, e)
			for _, v6 := range []bool{false, true} {
				a := e.topo.Addrs(v6)
				before := e.status().family(model.NodeToRemotePod, fam(v6))
				if err := tcp(e.topo.Remote, e.topo.Pod, a.Remote, a.Pod); err != nil {
					t.Fatalf("%s peer node -> pod: %v", fam(v6), err)
				}
				if got := e.status().family(model.NodeToRemotePod, fam(v6)).Bytes - before.Bytes; got < 2<<20 {
					t.Errorf("%s peer node -> pod: %d bytes redirected as node-to-remote-pod, want >= %d", fam(v6), got, 2<<20)
				}
			}
			st = e.status()
			if st.Via[ViaForwardingOff].Packets < st.total().Packets {
				t.Errorf("forwarding-off route used %d times, want every redirect (%d)", st.Via[ViaForwardingOff].Packets, st.total().Packets)
			}
			t.Logf("status: %+v", st)

			// Someone detaches it from eth0: the next apply repairs that.
			// The agent reports that as drift (a WARN and hostaccel_drift_repairs_total).
			e.do(func() error { return detachBehindOurBack(mode, e.topo.TransportName, st.ProgramID) })
			blocked(t, e.topo, false)
			if res := e.apply(); !slices.Equal(res.Attached, []string{"eth0"}) || res.Loaded ||
				!slices.Equal(res.Drift, []string{"program detached from eth0"}) {
				t.Errorf("repair apply = %+v, want eth0 re-attached, reported as drift", res)
			}
			if err := udp(e.topo, false, 10); err != nil {
				t.Errorf("after repair: %v", err)
			}
			// Someone deletes a map entry: restored, reported as drift.
			e.do(func() error {
				s, err := openSet(st.ProgramID)
				if err != nil {
					return err
				}
				defer s.Close()
				return s.deleteAddr(e.topo.V4.RemotePodCIDR)
			})
			if res := e.apply(); res.ElementsAdded != 1 || !slices.Equal(res.Drift, []string{"map addrs4/addrs6: 1 entries removed or changed, 0 added"}) {
				t.Errorf("apply after a map entry was deleted = %+v, want it restored, reported as drift", res)
			}
			if res := e.apply(); res.Drift != nil {
				t.Errorf("apply after the repair = %+v, want no drift", res)
			}

			// A program set of another build (an upgrade) is replaced in place.
			e.do(func() error {
				s, err := openSet(st.ProgramID)
				if err != nil {
					return err
				}
				defer s.Close()
				return s.settings.Put(uint32(0), fastpathSettings{Classes: 0b11, Build: 1})
			})
			res = e.apply()
			if !res.Loaded || res.ProgramID == st.ProgramID || !slices.Equal(res.Attached, []string{"eth0", "gw"}) || len(res.Detached) > 0 || res.Drift != nil {
				t.Errorf("upgrade apply = %+v, want a new program on eth0 and gw, no drift", res)
			}
			if got := attachedTo(e.status()); !slices.Equal(got, []string{"eth0/" + string(mode), "gw/" + string(mode)}) {
				t.Errorf("after upgrade attached to %v", got)
			}
			waitGone(t, []ebpf.ProgramID{st.ProgramID}, nil)
			if err := udp(e.topo, true, 10); err != nil {
				t.Errorf("after upgrade: %v", err)
			}

			// The transport is deleted and re-created: apply skips it meanwhile, then
			// attaches to the new device.
			oldIndex := testbed.LinkT(t, e.topo.Node, "eth0").Index
			h, _ := e.topo.Node.Handle()
			l, _ := h.LinkByName("eth0")
			if err := h.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			if res := e.apply(); !slices.Equal(res.Missing, []string{"eth0"}) || res.ElementsRemoved != 1 || res.Drift != nil {
				t.Errorf("apply without eth0 = %+v, want it missing and its ifaces entry removed, no drift", res)
			}
			recreateTransport(t, e.topo)
			if res := e.apply(); !slices.Equal(res.Attached, []string{"eth0"}) || len(res.Missing) > 0 || res.Drift != nil {
				t.Errorf("apply after re-creating eth0 = %+v, want eth0 attached, no drift", res)
			}
			st = e.status()
			if i := slices.IndexFunc(st.Devices, func(d Device) bool { return d.Name == "eth0" }); i < 0 || st.Devices[i].Index == oldIndex {
				t.Errorf("after re-creation: devices %+v, want eth0 with a new ifindex (old %d)", st.Devices, oldIndex)
			}
			for _, v6 := range []bool{false, true} {
				a := e.topo.Addrs(v6)
				if err := tcp(e.topo.Pod, e.topo.Remote, a.Pod, a.RemotePod); err != nil {
					t.Errorf("%s after re-creation: %v", fam(v6), err)
				}
			}

			removeAndCheck(t, e, true)
		})
	}
}

// needMode skips a test of an attach mode the kernel does not have (tcx: Linux >= 6.6); the
// host kernel has both, the VM's 6.1 only cls_bpf.
func needMode(t *testing.T, m Mode) {
	t.Helper()
	if m == ModeTCX && !haveTCX() {
		t.Skip("this kernel has no tcx (Linux >= 6.6); cls_bpf is tested instead")
	}
}

// removeAndCheck removes the datapath with a fresh Manager and checks that no program,
// filter, qdisc (when ownClsact) or map of it is left.
func removeAndCheck(t *testing.T, e *env, ownClsact bool) {
	t.Helper()
	st := e.status()
	var maps []ebpf.MapID
	e.do(func() error {
		s, err := openSet(st.ProgramID)
		if err != nil || s == nil {
			return fmt.Errorf("program %d: %v", st.ProgramID, err)
		}
		defer s.Close()
		for _, m := range []*ebpf.Map{s.maps.Ifaces, s.maps.Addrs4, s.maps.Addrs6, s.settings, s.maps.Stats, s.maps.Handed} {
			info, err := m.Info()
			if err != nil {
				return err
			}
			id, _ := info.ID()
			maps = append(maps, id)
		}
		return nil
	})
	if len(maps) != 6 {
		t.Errorf("program %d has %d maps, want 6", st.ProgramID, len(maps))
	}
	e.do(func() error { return NewManager().Remove(context.Background()) })
	if st := e.status(); st.Mode != "" || len(st.Devices) > 0 {
		t.Errorf("status after remove: %+v", st)
	}
	e.do(func() error {
		for _, dev := range []string{e.topo.GatewayName, e.topo.TransportName} {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			if haveTCX() {
				q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
				if err != nil {
					return err
				}
				if len(q.Programs) > 0 {
					t.Errorf("%s: tcx programs left: %v", dev, q.Programs)
				}
			}
			clsact, err := hasClsact(l)
			if err != nil {
				return err
			}
			if clsact && ownClsact {
				t.Errorf("%s: clsact qdisc left", dev)
			}
			if clsact {
				if fs, _ := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS); len(fs) > 0 {
					t.Errorf("%s: filters left: %v", dev, fs)
				}
			}
		}
		return nil
	})
	waitGone(t, []ebpf.ProgramID{st.ProgramID}, maps)
	for _, v6 := range []bool{false, true} {
		blocked(t, e.topo, v6)
	}
}

// waitGone waits until the programs and maps no longer exist (the kernel frees them after an
// RCU grace period: in the emulated VM on a loaded host, 5 s was once too short).
func waitGone(t *testing.T, progs []ebpf.ProgramID, maps []ebpf.MapID) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	gone := func(what string, open func() (io.Closer, error)) {
		t.Helper()
		for {
			c, err := open()
			if err != nil {
				return
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Errorf("%s still exists", what)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, id := range progs {
		gone(fmt.Sprintf("program %d", id), func() (io.Closer, error) { return ebpf.NewProgramFromID(id) })
	}
	for _, id := range maps {
		gone(fmt.Sprintf("map %d", id), func() (io.Closer, error) { return ebpf.NewMapFromID(id) })
	}
}

// recreateTransport re-creates the Node <-> Remote link with its addresses and routes.
func recreateTransport(t *testing.T, topo *testbed.Topo) {
	t.Helper()
	if err := topo.RecreateTransport(); err != nil {
		t.Fatal(err)
	}
}

// detachBehindOurBack takes the program off dev as another tool would.
func detachBehindOurBack(mode Mode, dev string, id ebpf.ProgramID) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	if mode == ModeClsBPF {
		fs, err := ourFilters(l)
		if err != nil || len(fs) != 1 {
			return fmt.Errorf("filters %v: %v", fs, err)
		}
		return netlink.FilterDel(fs[0])
	}
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return err
	}
	defer p.Close()
	return link.RawDetachProgram(link.RawDetachProgramOptions{Target: l.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress})
}

// TestForwardingOn covers the FIB path of a normal router: the stack's forward path is
// bypassed (its counters stay still), the TTL is decremented and MACs are right; traffic
// outside the classes, ICMP and ICMP errors take the normal path.
func TestForwardingOn(t *testing.T) {
	e := newEnv(t, "")
	e.apply()

	fwd4, fwd6 := netSNMP(t, e.topo.Node, false), netSNMP(t, e.topo.Node, true)
	flows(t, e)
	onTheWire(t, e)
	st := e.status()
	d4, d6 := netSNMP(t, e.topo.Node, false)-fwd4, netSNMP(t, e.topo.Node, true)-fwd6
	t.Logf("redirected %d packets; the stack forwarded %d IPv4, %d IPv6 meanwhile; passed %+v", st.total().Packets, d4, d6, st.Passed)
	if d4 > 5 || d6 > 5 {
		t.Errorf("the stack forwarded %d IPv4 and %d IPv6 packets of %d, want (almost) none", d4, d6, st.total().Packets)
	}
	if n := st.Via[ViaForwardingOff].Packets; n > 0 {
		t.Errorf("%d packets used the forwarding-off route with forwarding on", n)
	}
	// Both devices are veths with their peer in another namespace: ingress to ingress.
	if n := st.Via[ViaPeer].Packets; n < st.total().Packets*9/10 {
		t.Errorf("%d of %d packets went by bpf_redirect_peer, want (almost) all", n, st.total().Packets)
	}
	// The flows' pairs are few: after each pair's first packet on a CPU, the express lane.
	if n := st.Via[ViaExpress].Packets; n < st.total().Packets*8/10 {
		t.Errorf("%d of %d packets went by the express lane, want most", n, st.total().Packets)
	}
	t.Logf("by the express lane: %d of %d", st.Via[ViaExpress].Packets, st.total().Packets)

	t.Run("NoPeer", func(t *testing.T) {
		// Devices that are not such veths (a NIC, an OVS port) get bpf_redirect to their
		// egress, with the FIB's MACs.
		usePeer = false
		defer func() { usePeer = true; e.apply() }()
		if res := e.apply(); res.ElementsUpdated != 2 {
			t.Errorf("apply without peers = %+v, want the 2 ifaces entries updated", res)
		}
		before := e.status()
		flows(t, e)
		onTheWire(t, e)
		if after := e.status(); after.Via[ViaPeer] != before.Via[ViaPeer] {
			t.Errorf("bpf_redirect_peer used %d times without peers", after.Via[ViaPeer].Packets-before.Via[ViaPeer].Packets)
		}
	})

	t.Run("NoNeigh", func(t *testing.T) {
		// An unresolved next hop: bpf_redirect_neigh resolves it (queueing the packet);
		// later packets take the FIB's MACs.
		for _, v6 := range []bool{false, true} {
			if _, err := e.topo.Node.Exec("ip", "neigh", "flush", "dev", e.topo.TransportName); err != nil {
				t.Fatal(err)
			}
			before := e.status()
			if err := udp(e.topo, v6, 10); err != nil {
				t.Fatalf("%s: %v", fam(v6), err)
			}
			after := e.status()
			nn, red := after.Via[ViaNeigh].Packets-before.Via[ViaNeigh].Packets, after.total().Packets-before.total().Packets
			if nn < 1 || red != 20 {
				t.Errorf("%s: %d through neighbour resolution, %d redirected; want >= 1 of 20 redirected", fam(v6), nn, red)
			}
		}
	})

	t.Run("OutOfClass", func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			a := e.topo.Addrs(v6)
			before := e.status()
			if err := tcp(e.topo.Remote, e.topo.Pod, a.External, a.Pod); err != nil {
				t.Fatalf("%s external -> pod: %v", fam(v6), err)
			}
			if after := e.status(); after.total() != before.total() {
				t.Errorf("%s external -> pod: class counters %+v -> %+v, want unchanged", fam(v6), before.total(), after.total())
			}
		}
	})

	t.Run("ICMP", func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			a := e.topo.Addrs(v6)
			before := e.status()
			if err := ping(e.topo.Pod, a.RemotePod); err != nil {
				t.Errorf("%s ping: %v", fam(v6), err)
			}
			if after := e.status(); after.total() != before.total() {
				t.Errorf("%s ping: class counters %+v -> %+v, want unchanged", fam(v6), before.total(), after.total())
			}

			// UDP to a closed port: the datagram is redirected, the port unreachable error
			// comes back through the stack.
			before = e.status()
			c, err := e.topo.Pod.DialUDP("", netip.AddrPortFrom(a.RemotePod, 9).String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("x"))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 8))
			c.Close()
			if !errors.Is(err, unix.ECONNREFUSED) {
				t.Errorf("%s UDP to a closed port: %v, want connection refused (ICMP error delivered)", fam(v6), err)
			}
			if got := e.status().total().Packets - before.total().Packets; got != 1 {
				t.Errorf("%s UDP to a closed port: %d packets redirected, want 1 (the datagram, not the error)", fam(v6), got)
			}

			// Larger than the next hop's MTU: the stack sends the ICMP error (the Pod's
			// socket learns the path MTU).
			setTransportMTU(t, e.topo, 1280)
			e.apply() // the agent does on the link event: the kept next hops are void
			before = e.status()
			c, err = e.topo.Pod.DialUDP("", netip.AddrPortFrom(a.RemotePod, 9).String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write(make([]byte, 1400))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 8))
			c.Close()
			if !errors.Is(err, unix.EMSGSIZE) {
				t.Errorf("%s 1400 bytes over a 1280 MTU: %v, want message too long (ICMP error delivered)", fam(v6), err)
			}
			after := e.status()
			if got := after.Passed[PassFragNeeded].Packets - before.Passed[PassFragNeeded].Packets; got != 1 || after.total() != before.total() {
				t.Errorf("%s 1400 bytes over a 1280 MTU: %d counted as frag-needed, class counters %+v -> %+v; want 1 and unchanged", fam(v6), got, before.total(), after.total())
			}
			// TCP adapts to it (MSS), and is redirected again.
			if err := tcp(e.topo.Pod, e.topo.Remote, a.Pod, a.RemotePod); err != nil {
				t.Errorf("%s TCP over a 1280 MTU: %v", fam(v6), err)
			}
			if got := e.status().total().Bytes - after.total().Bytes; got < 2<<20 {
				t.Errorf("%s TCP over a 1280 MTU: %d bytes redirected, want >= %d", fam(v6), got, 2<<20)
			}
			setTransportMTU(t, e.topo, 1500)
			e.apply()

			// TTL 1: the stack sends time exceeded.
			before = e.status()
			if err := sendTTL1(e.topo.Pod, a.RemotePod); err != nil {
				t.Fatal(err)
			}
			after = e.status()
			if got := after.Passed[PassTTL].Packets - before.Passed[PassTTL].Packets; got != 1 || after.total() != before.total() {
				t.Errorf("%s TTL 1: %d counted as ttl-expired, class counters %+v -> %+v; want 1 and unchanged", fam(v6), got, before.total(), after.total())
			}
		}
	})
}

// ping sends an ICMP echo request from ns to dst and waits for the reply.
func ping(ns *testbed.NS, dst netip.Addr) error {
	return ns.Do(func() error {
		network, req, rep := "ip4:icmp", byte(8), byte(0)
		if dst.Is6() {
			network, req, rep = "ip6:ipv6-icmp", 128, 129
		}
		c, err := net.ListenPacket(network, "")
		if err != nil {
			return err
		}
		defer c.Close()
		msg := []byte{req, 0, 0, 0, 0x4a, 0x11, 0, 1, 'h', 'o', 's', 't'}
		if dst.Is4() { // the kernel computes ICMPv6 checksums itself
			var sum uint32
			for i := 0; i < len(msg); i += 2 {
				sum += uint32(msg[i])<<8 | uint32(msg[i+1])
			}
			sum = sum>>16 + sum&0xffff
			sum += sum >> 16
			binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
		}
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("no echo reply: %w", err)
			}
			if n >= 8 && buf[0] == rep && buf[4] == 0x4a && buf[5] == 0x11 {
				return nil
			}
		}
	})
}

// setTransportMTU sets the MTU of both ends of the Node <-> Remote link.
func setTransportMTU(t *testing.T, topo *testbed.Topo, mtu int) {
	t.Helper()
	for ns, dev := range map[*testbed.NS]string{topo.Node: topo.TransportName, topo.Remote: "eth0"} {
		h, err := ns.Handle()
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.LinkByName(dev)
		if err == nil {
			err = h.LinkSetMTU(l, mtu)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// sendTTL1 sends one UDP datagram with TTL / hop limit 1 from ns to dst.
func sendTTL1(ns *testbed.NS, dst netip.Addr) error {
	c, err := ns.DialUDP("", netip.AddrPortFrom(dst, 9).String())
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if dst.Is6() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 1)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return err
	}
	_, err = c.Write([]byte("ttl1"))
	time.Sleep(100 * time.Millisecond)
	return err
}

// TestExclude: an excluded remote Pod is not redirected; with forwarding off it is
// unreachable, with forwarding on the stack carries it.
func TestExclude(t *testing.T) {
	e := newEnv(t, "")
	for _, a := range []testbed.Addrs{e.topo.V4, e.topo.V6} {
		e.d.Exclude = append(e.d.Exclude, netip.PrefixFrom(a.RemotePod, a.RemotePod.BitLen()))
	}
	e.apply()
	e.forwarding(false)
	for _, v6 := range []bool{false, true} {
		blocked(t, e.topo, v6)
	}
	st := e.status()
	if st.Passed[PassExcluded].Packets == 0 || st.total().Packets != 0 {
		t.Errorf("forwarding off: excluded %d, redirected %d; want > 0 and 0", st.Passed[PassExcluded].Packets, st.total().Packets)
	}
	e.forwarding(true)
	for _, v6 := range []bool{false, true} {
		a := e.topo.Addrs(v6)
		if err := tcp(e.topo.Pod, e.topo.Remote, a.Pod, a.RemotePod); err != nil {
			t.Errorf("%s forwarding on: %v", fam(v6), err)
		}
	}
	if st := e.status(); st.total().Packets != 0 {
		t.Errorf("forwarding on: %d packets redirected, want 0", st.total().Packets)
	}

	// Dropping the exclusion redirects again.
	e.d.Exclude = nil
	if res := e.apply(); res.ElementsRemoved != 2 || res.Loaded {
		t.Errorf("apply without exclusions = %+v, want 2 elements removed", res)
	}
	e.forwarding(false)
	if err := udp(e.topo, false, 10); err != nil {
		t.Error(err)
	}

	// A device no longer desired is detached.
	delete(e.d.Devices, e.topo.GatewayName)
	if res := e.apply(); !slices.Equal(res.Detached, []string{"gw"}) || res.ElementsRemoved != 3 || len(res.Attached) > 0 {
		t.Errorf("apply without gw = %+v, want gw detached, its ifaces entry and its 2 addresses (the node's) removed", res)
	}
	mode, _ := NewManager().mode()
	if got := attachedTo(e.status()); !slices.Equal(got, []string{"eth0/" + string(mode)}) {
		t.Errorf("attached to %v, want [eth0/%s]", got, mode)
	}
	blocked(t, e.topo, false)
}

// TestModeSwitch moves from cls_bpf to tcx and back without a gap, and leaves a clsact
// qdisc someone else created alone.
func TestModeSwitch(t *testing.T) {
	needMode(t, ModeTCX)
	e := newEnv(t, ModeClsBPF)
	e.do(func() error {
		_, err := ensureClsact(testbed.LinkT(t, e.topo.Node, e.topo.GatewayName).Index)
		return err
	}) // not ours
	e.forwarding(false)
	e.apply()
	if got := attachedTo(e.status()); !slices.Equal(got, []string{"eth0/cls_bpf", "gw/cls_bpf"}) {
		t.Errorf("attached to %v", got)
	}
	e.mode = ModeTCX
	if res := e.apply(); res.Loaded || !slices.Equal(res.Attached, []string{"eth0", "gw"}) {
		t.Errorf("switch to tcx = %+v", res)
	}
	if got := attachedTo(e.status()); !slices.Equal(got, []string{"eth0/tcx", "gw/tcx"}) {
		t.Errorf("attached to %v", got)
	}
	e.do(func() error {
		for dev, want := range map[string]bool{"gw": true, "eth0": false} {
			l, _ := netlink.LinkByName(dev)
			if got, err := hasClsact(l); err != nil || got != want {
				t.Errorf("%s: clsact %v (%v), want %v", dev, got, err, want)
			}
		}
		return nil
	})
	if err := udp(e.topo, true, 10); err != nil {
		t.Error(err)
	}
	e.mode = ModeClsBPF
	e.apply()
	if err := udp(e.topo, false, 10); err != nil {
		t.Error(err)
	}
	removeAndCheck(t, e, false)
	e.do(func() error {
		for dev, want := range map[string]bool{"gw": true, "eth0": false} {
			l, _ := netlink.LinkByName(dev)
			if got, err := hasClsact(l); err != nil || got != want {
				t.Errorf("after remove: %s: clsact %v (%v), want %v (only ours removed)", dev, got, err, want)
			}
		}
		return nil
	})
}

// TestNoDevices: with no desired device present nothing is loaded, and Remove on a clean
// namespace succeeds.
func TestNoDevices(t *testing.T) {
	e := newEnv(t, "")
	e.d.Devices = map[string]Role{"nope0": RoleGateway}
	if res := e.apply(); !slices.Equal(res.Missing, []string{"nope0"}) || res.Loaded {
		t.Errorf("apply = %+v", res)
	}
	if st := e.status(); st.Mode != "" || len(st.Devices) > 0 || st.ProgramID != 0 {
		t.Errorf("status = %+v", st)
	}
	e.do(func() error { return NewManager().Remove(context.Background()) })
}

// TestNexthopCache: the program keeps the FIB's answers per destination while they depend on
// the destination alone, and an update voids them; with a policy routing rule it keeps none.
func TestNexthopCache(t *testing.T) {
	e := newEnv(t, "")
	e.apply()
	if err := udp(e.topo, false, 10); err != nil {
		t.Fatal(err)
	}
	kept := func() (n int, flags, gen uint32) {
		e.onSet(func(s *progSet) error {
			var cfg fastpathSettings
			if err := s.settings.Lookup(uint32(0), &cfg); err != nil {
				return err
			}
			flags = cfg.Flags
			var k fastpathNexthopKey
			var v fastpathNexthop
			for it := s.maps.Nexthops.Iterate(); it.Next(&k, &v); {
				if v.Generation == cfg.Generation {
					n++
				}
			}
			return nil
		})
		return
	}
	if n, flags, _ := kept(); n != 2 || flags&settingsNexthopCache == 0 {
		t.Errorf("after UDP both ways: %d next hops kept (flags %b), want 2 (one per direction)", n, flags)
	}
	e.apply()
	if n, _, _ := kept(); n != 0 {
		t.Errorf("after an update: %d next hops of the current generation, want 0", n)
	}
	if out, err := e.topo.Node.Exec("ip", "rule", "add", "from", e.topo.V4.Pod.String(), "table", "100"); err != nil {
		t.Fatal(err, out)
	}
	e.apply()
	if err := udp(e.topo, false, 10); err != nil {
		t.Fatal(err)
	}
	if n, flags, _ := kept(); n != 0 || flags&settingsNexthopCache != 0 {
		t.Errorf("with a policy routing rule: %d next hops kept (flags %b), want none", n, flags)
	}
}

// With FullEvery, an Apply within it diffs against what the last one wrote instead of reading
// the maps back: a map entry deleted behind its back stays deleted until the next whole
// reading, which restores it and reports the drift.
func TestApplyReadsMapsWholeEvery(t *testing.T) {
	e := newEnv(t, "")
	e.m.FullEvery = time.Hour
	if res := e.apply(); !res.FullRead || !res.Loaded {
		t.Fatalf("first apply = %+v, want a new program, its maps read", res)
	}
	if res := e.apply(); res.FullRead || res.Drift != nil {
		t.Errorf("second apply within FullEvery = %+v, want no reading, no drift", res)
	}
	id := e.status().ProgramID
	// present reports whether the remote Pod CIDR is in the map; del deletes it.
	onSet := func(fn func(s *progSet) error) {
		e.do(func() error {
			s, err := openSet(id)
			if err != nil {
				return err
			}
			defer s.Close()
			return fn(s)
		})
	}
	cidr := e.topo.V4.RemotePodCIDR
	present := func() (ok bool) {
		onSet(func(s *progSet) error {
			var a fastpathAddr
			ok = s.addrMap(cidr).Lookup(lpmKey(cidr), &a) == nil
			return nil
		})
		return ok
	}
	if !present() {
		t.Fatal("the remote Pod CIDR is not in the map after the apply")
	}
	onSet(func(s *progSet) error { return s.deleteAddr(cidr) })
	if res := e.apply(); res.FullRead || res.Drift != nil || res.ElementsAdded != 0 {
		t.Errorf("apply within FullEvery after a deletion = %+v, want nothing read, nothing seen", res)
	}
	if present() {
		t.Error("the deleted entry came back without a whole reading")
	}
	e.m.fullRead = time.Time{} // FullEvery has passed
	res := e.apply()
	if !res.FullRead || res.ElementsAdded != 1 || !slices.Equal(res.Drift, []string{"map addrs4/addrs6: 1 entries removed or changed, 0 added"}) {
		t.Errorf("apply when FullEvery is due = %+v, want the entry restored, reported as drift", res)
	}
	if !present() {
		t.Error("the deleted entry is still missing after the whole reading")
	}
	if err := udp(e.topo, false, 10); err != nil {
		t.Error(err)
	}
}

// An apply voids every kept pair (a new generation) and clears their filter bits, so that a
// packet without a pair skips that lookup again; the pairs kept after it set their bits anew.
func TestApplyClearsPairBits(t *testing.T) {
	e := newEnv(t, "")
	e.apply()
	set := func() (n int) {
		e.onSet(func(s *progSet) error {
			var k uint32
			var w uint64
			it := s.maps.PairBits.Iterate()
			for it.Next(&k, &w) {
				n += bits.OnesCount64(w)
			}
			return it.Err()
		})
		return n
	}
	if n := set(); n != 0 {
		t.Fatalf("after the first apply: %d pair bits set, want 0", n)
	}
	if err := udp(e.topo, false, 10); err != nil {
		t.Fatal(err)
	}
	if n := set(); n < 2 {
		t.Fatalf("after UDP both ways: %d pair bits set, want one per direction at least", n)
	}
	if res := e.apply(); res.Loaded {
		t.Fatalf("second apply loaded a new program (%+v): the bits would be new anyway", res)
	}
	if n := set(); n != 0 {
		t.Errorf("after an update: %d pair bits set, want 0", n)
	}
	if err := udp(e.topo, false, 10); err != nil {
		t.Fatal(err)
	}
	if n := set(); n < 2 {
		t.Errorf("after UDP again: %d pair bits set, want one per direction at least", n)
	}
}

// Apply ages the handed marks once the sample shows more than 1/16 of them counting (here
// written as the program would), and not again within a minute; status shows them.
func TestApplyAgesHandedMarks(t *testing.T) {
	e := newEnv(t, "")
	if !e.apply().NATCheck {
		t.Skip("no conntrack kfuncs here: no NAT check, no marks")
	}
	settings := func(s *progSet) (cfg fastpathSettings) {
		if err := s.settings.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	fill := func() {
		e.onSet(func(s *progSet) error {
			keys, marks := make([]uint32, 600), make([]uint64, 600)
			for i := range keys {
				keys[i], marks[i] = uint32(i*6), uint64(settings(s).HandedEpoch)
			}
			_, err := s.maps.HandedMarks.BatchUpdate(keys, marks, nil)
			return err
		})
	}
	fill()
	if st := e.status(); st.Handed == nil || st.Handed.Marked != 600 || st.Handed.Of != handedMarks || st.Handed.Epoch != handedFirstEpoch {
		t.Errorf("status handed %+v, want 600 marked of %d in epoch %d", st.Handed, handedMarks, handedFirstEpoch)
	}
	if r := e.apply(); !r.HandedAged {
		t.Errorf("600 of the first %d marks counting: not aged (%+v)", handedSample, r)
	}
	e.onSet(func(s *progSet) error {
		if cfg := settings(s); cfg.HandedEpoch != handedFirstEpoch+1 || cfg.HandedSince != cfg.HandedEpoch {
			t.Errorf("after aging: epoch %d, since %d; want both %d", cfg.HandedEpoch, cfg.HandedSince, handedFirstEpoch+1)
		}
		return nil
	})
	if st := e.status(); st.Handed == nil || st.Handed.Marked != 0 {
		t.Errorf("after aging: status handed %+v, want none marked (no NAT-ed connection here)", st.Handed)
	}
	fill()
	if r := e.apply(); r.HandedAged {
		t.Errorf("aged again within %s", handedAgeEvery)
	}
}

// A Manager that watches the routes (the agent's) lists them again only when the kernel
// announced a change, or with the maps read whole: and a changed route reaches the map at the
// next apply.
func TestApplyKeepsRoutesUntilAnnounced(t *testing.T) {
	e := newEnv(t, "")
	e.m.FullEvery = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.do(func() error { return e.m.WatchRoutes(ctx) })
	listed := func() int {
		e.m.routes.mu.Lock()
		defer e.m.routes.mu.Unlock()
		return e.m.routes.listed
	}
	e.apply()
	e.apply() // (the first apply's own attachments may have been announced)
	n := listed()
	if e.apply(); listed() != n {
		t.Fatalf("an apply with nothing announced listed the routes (%d listings, %d before)", listed(), n)
	}
	cidr := e.topo.V4.RemotePodCIDR
	egress := func() (idx uint32) {
		e.onSet(func(s *progSet) error {
			var a fastpathAddr
			if err := s.addrMap(cidr).Lookup(lpmKey(cidr), &a); err != nil {
				return err
			}
			idx = a.Egress
			return nil
		})
		return idx
	}
	var gw, transport uint32
	e.do(func() error {
		for name, idx := range map[string]*uint32{e.topo.GatewayName: &gw, e.topo.TransportName: &transport} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			*idx = uint32(l.Attrs().Index)
		}
		return nil
	})
	if got := egress(); got != transport {
		t.Fatalf("egress of %s = %d, want the transport's %d", cidr, got, transport)
	}
	if out, err := e.topo.Node.Exec("ip", "route", "replace", cidr.String(), "dev", e.topo.GatewayName); err != nil {
		t.Fatal(err, out)
	}
	if e.apply(); listed() != n+1 {
		t.Errorf("the apply after a route changed listed %d times, want %d", listed()-n, 1)
	}
	if got := egress(); got != gw {
		t.Errorf("egress of %s after its route moved = %d, want the gateway's %d", cidr, got, gw)
	}
	if e.apply(); listed() != n+1 {
		t.Errorf("an apply with nothing announced since listed the routes again")
	}
	e.m.fullRead = time.Time{} // FullEvery has passed: the routes are listed with the maps
	if res := e.apply(); !res.FullRead || listed() != n+2 {
		t.Errorf("a whole reading (%v) listed the routes %d times, want 1", res.FullRead, listed()-n-1)
	}
	cancel() // the watch ends: every apply lists
	e.m.routes.mu.Lock()
	for e.m.routes.s != nil {
		e.m.routes.mu.Unlock()
		time.Sleep(time.Millisecond)
		e.m.routes.mu.Lock()
	}
	e.m.routes.mu.Unlock()
	e.apply()
	e.apply()
	if listed() != n+4 {
		t.Errorf("after the watch ended, two applies listed the routes %d times, want 2", listed()-n-2)
	}
}

// Prefetch reads on another goroutine, which may run on a thread in another network
// namespace than the caller's: it reads the caller's (the Node's here), so the Apply that
// takes its reading finds the Node's devices.
func TestPrefetchReadsTheCallersNamespace(t *testing.T) {
	e := newEnv(t, "")
	for range 2 { // a fresh program set, then the maps read whole
		e.do(func() error {
			e.m.Prefetch()
			if e.m.pre == nil {
				t.Error("Prefetch started no reading")
			}
			return nil
		})
		if res := e.apply(); len(res.Missing) > 0 || !res.FullRead || e.m.pre != nil {
			t.Errorf("apply after Prefetch = %+v (prefetched reading left: %v)", res, e.m.pre != nil)
		}
	}
	if err := udp(e.topo, false, 10); err != nil {
		t.Error(err)
	}
}

// cls_bpf: a device that vanished after the Apply listed it (a Pod's veth deleted) is skipped
// where clsact qdiscs are added, not an error that fails the Apply; and the qdiscs an Apply
// added are deleted again when it fails before the map records them as ours.
func TestOwnClsactsSkipsAVanishedDevice(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("clsact")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if out, err := ns.Exec("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"); err != nil {
		t.Fatal(out, err)
	}
	err = ns.Do(func() error {
		l, err := netlink.LinkByName("d0")
		if err != nil {
			return err
		}
		idx := uint32(l.Attrs().Index)
		ifaces := map[uint32]fastpathIface{idx: {}, 99999: {}}
		added, err := ownClsacts(ifaces)
		if err != nil || !slices.Equal(added, []uint32{idx}) || ifaces[idx].Flags&flagOwnClsact == 0 {
			return fmt.Errorf("ownClsacts with a vanished device: added %v, %v, flags %#x", added, err, ifaces[idx].Flags)
		}
		if ok, err := hasClsact(l); !ok || err != nil {
			return fmt.Errorf("no clsact added on d0: %v", err)
		}
		dropClsacts(added)
		if ok, err := hasClsact(l); ok || err != nil {
			return fmt.Errorf("the clsact added is still on d0 after dropClsacts: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// A device the new program set cannot be attached to (here: an upgrade whose attach fails on
// the gateway) keeps no program of the older set: that set's maps are no longer written, so a
// peer CIDR removed or an exclusion added since would still be redirected there. Its packets
// take the stack until an attach succeeds, and the error says so. Before, the older program
// stayed on the device.
func TestAttachFailureLeavesNoOlderProgram(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeClsBPF} {
		t.Run(string(mode), func(t *testing.T) {
			needMode(t, mode)
			e := newEnv(t, mode)
			old := e.apply().ProgramID
			e.onSet(func(s *progSet) error { // a set of another build: the next apply loads a new one
				return s.settings.Put(uint32(0), fastpathSettings{Classes: 0b11, Build: 1})
			})
			gw := e.topo.GatewayName
			attachProgram = func(mode Mode, l netlink.Link, set *progSet, mine []attachment, sets map[ebpf.ProgramID]*progSet) (attachment, error) {
				if l.Attrs().Name == gw {
					return attachment{}, fmt.Errorf("%s: attach %s: injected failure", gw, mode)
				}
				return attach(mode, l, set, mine, sets)
			}
			t.Cleanup(func() { attachProgram = attach })
			var res Result
			var err error
			e.do(func() error { res, err = e.m.Apply(context.Background(), e.d); return nil })
			if err == nil || !strings.Contains(err.Error(), "injected failure") || !strings.Contains(err.Error(), fmt.Sprintf("program %d", old)) {
				t.Errorf("apply with gw's attach failing: %+v, %v; want the failure, naming the older program detached", res, err)
			}
			progs := func() map[string][]ebpf.ProgramID {
				out := map[string][]ebpf.ProgramID{}
				e.do(func() error {
					o, err := observe()
					if err != nil {
						return err
					}
					defer o.Close()
					for name, l := range o.links {
						for _, a := range o.on(l.Attrs().Index) {
							out[name] = append(out[name], a.prog)
						}
					}
					return nil
				})
				return out
			}
			got := progs()
			if !slices.Equal(got[e.topo.TransportName], []ebpf.ProgramID{res.ProgramID}) || len(got[gw]) != 0 {
				t.Errorf("programs after the failed attach: %v; want the new one (%d) on %s and none on %s (the older was %d)",
					got, res.ProgramID, e.topo.TransportName, gw, old)
			}
			attachProgram = attach
			if res := e.apply(); !slices.Equal(res.Attached, []string{gw}) {
				t.Errorf("next apply = %+v, want %s attached", res, gw)
			}
			if got := progs(); !slices.Equal(got[gw], []ebpf.ProgramID{res.ProgramID}) {
				t.Errorf("programs after the next apply: %v, want %d on %s", got, res.ProgramID, gw)
			}
		})
	}
}

// Prepare (the agent, on a new gateway's link event) adds the clsact qdisc before the Apply that
// attaches there; that Apply counts it as hostaccel's, so a later process's Remove deletes it.
// A prepared device no Apply wants within preparedFor loses its qdisc again. Where the kernel
// has tcx, Prepare adds nothing.
func TestPreparedClsact(t *testing.T) {
	e := newEnv(t, ModeClsBPF)
	e.forwarding(false) // (removeAndCheck checks that traffic stops)
	gw := e.topo.GatewayName
	role := e.d.Devices[gw]
	delete(e.d.Devices, gw)
	e.apply()
	clsact := hasClsactNamed
	e.do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "stray0"}, PeerName: "stray1"}); err != nil {
			return err
		}
		for _, name := range []string{gw, "stray0"} {
			if err := e.m.Prepare(testbed.LinkT(t, e.topo.Node, name).Index); err != nil {
				return err
			}
		}
		return nil
	})
	if !clsact(e, gw) || !clsact(e, "stray0") {
		t.Fatalf("after Prepare: clsact on %s %v, on stray0 %v; want both", gw, clsact(e, gw), clsact(e, "stray0"))
	}
	e.d.Devices[gw] = role
	defer func(d time.Duration) { preparedFor = d }(preparedFor)
	preparedFor = 0
	if res := e.apply(); !slices.Equal(res.Attached, []string{gw}) {
		t.Errorf("apply after Prepare: %+v, want attached to %s", res, gw)
	}
	if clsact(e, "stray0") {
		t.Error("the qdisc of a prepared device no Apply wanted is still there")
	}
	removeAndCheck(t, e, true) // the prepared gateway's qdisc is ours: Remove deletes it
	if clsact(e, gw) {
		t.Errorf("after Remove: %s keeps the clsact qdisc Prepare added", gw)
	}
	// A link event handled after the agent's own Remove (it stops: its link watch still
	// runs) adds nothing that no one would delete.
	e.do(func() error { return e.m.Remove(context.Background()) })
	e.do(func() error { return e.m.Prepare(testbed.LinkT(t, e.topo.Node, gw).Index) })
	if clsact(e, gw) {
		t.Error("Prepare after Remove added a clsact qdisc")
	}
	if haveTCX() {
		e2 := newEnv(t, "")
		e2.do(func() error { return e2.m.Prepare(testbed.LinkT(t, e2.topo.Node, e2.topo.GatewayName).Index) })
		if clsact(e2, e2.topo.GatewayName) {
			t.Error("with tcx, Prepare added a clsact qdisc")
		}
	}
}
