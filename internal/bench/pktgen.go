package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// PktgenResult is what pktgen reports for its device after a run.
type PktgenResult struct {
	Sent   uint64  `json:"sent"`   // pkts-sofar
	Errors uint64  `json:"errors"` // transmit errors (not sent)
	USec   uint64  `json:"usec"`   // elapsed, in the kernel's clock
	PPS    float64 `json:"pps"`    // pktgen's own rate (sent / elapsed)
	Size   int     `json:"size"`   // bytes per packet
}

var (
	pgSofar  = regexp.MustCompile(`pkts-sofar:\s*(\d+)\s+errors:\s*(\d+)`)
	pgResult = regexp.MustCompile(`Result: OK: (\d+)\(c\d+\+d\d+\) usec, (\d+) \((\d+)byte`)
	pgPPS    = regexp.MustCompile(`(\d+)pps`)
	pgResAny = regexp.MustCompile(`Result: (.*)`)
)

// ParsePktgen reads /proc/net/pktgen/<dev> after a run.
func ParsePktgen(s string) (PktgenResult, error) {
	var r PktgenResult
	loc := pgResult.FindStringSubmatchIndex(s)
	if loc == nil {
		if a := pgResAny.FindStringSubmatch(s); a != nil {
			return r, fmt.Errorf("pktgen: %s", a[1])
		}
		return r, errors.New("pktgen: no result")
	}
	m := pgResult.FindStringSubmatch(s)
	r.USec, _ = strconv.ParseUint(m[1], 10, 64)
	r.Size, _ = strconv.Atoi(m[3])
	if c := pgSofar.FindStringSubmatch(s); c != nil {
		r.Sent, _ = strconv.ParseUint(c[1], 10, 64)
		r.Errors, _ = strconv.ParseUint(c[2], 10, 64)
	} else {
		r.Sent, _ = strconv.ParseUint(m[2], 10, 64)
	}
	if p := pgPPS.FindStringSubmatch(s[loc[1]:]); p != nil { // the rate after the result, not a device named x1pps
		r.PPS, _ = strconv.ParseFloat(p[1], 64)
	}
	return r, nil
}

// Pktgen drives the kernel's packet generator inside one namespace (pktgen's /proc files
// are per network namespace).
type Pktgen struct {
	NS     *testbed.NS
	Dev    string
	Thread int // kpktgend_<Thread>: the CPU it runs on
}

// PktgenConfig is one flow of identical UDP packets.
type PktgenConfig struct {
	Count    uint64
	Size     int
	Src, Dst netip.Addr
	DstMAC   net.HardwareAddr
	Port     uint16 // source and destination port
}

func (p Pktgen) write(file, cmd string) error {
	return p.NS.Do(func() error {
		// /proc/net follows the process's first thread; thread-self follows this one,
		// which NS.Do moved into the namespace.
		path := filepath.Join("/proc/thread-self/net/pktgen", file)
		// pgctrl drops the last byte (it expects echo's newline).
		if err := os.WriteFile(path, []byte(cmd+"\n"), 0); err != nil {
			return fmt.Errorf("pktgen: %s <- %q: %w", file, cmd, err)
		}
		return nil
	})
}

// Available loads the pktgen module if needed and reports whether this kernel has it.
func PktgenAvailable(ctx context.Context) error {
	if _, err := os.Stat("/proc/net/pktgen"); err == nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, "modprobe", "pktgen").CombinedOutput()
	if err != nil {
		return fmt.Errorf("no pktgen in this kernel (modprobe pktgen: %v: %s)", err, firstLines(string(out), 1))
	}
	if _, err := os.Stat("/proc/net/pktgen"); err != nil {
		return fmt.Errorf("no pktgen in this kernel: %w", err)
	}
	return nil
}

// Configure binds the device to the generator thread and sets the flow.
func (p Pktgen) Configure(c PktgenConfig) error {
	thread := fmt.Sprintf("kpktgend_%d", p.Thread)
	cmds := []struct{ file, cmd string }{
		{thread, "rem_device_all"},
		{thread, "add_device " + p.Dev},
		{p.Dev, fmt.Sprintf("count %d", c.Count)},
		{p.Dev, "clone_skb 0"}, // veth does not take shared skbs
		{p.Dev, fmt.Sprintf("pkt_size %d", c.Size)},
		{p.Dev, "delay 0"},
		{p.Dev, "burst 1"},
		{p.Dev, "src_min " + c.Src.String()},
		{p.Dev, "src_max " + c.Src.String()},
		{p.Dev, "dst " + c.Dst.String()},
		{p.Dev, "dst_mac " + c.DstMAC.String()},
		{p.Dev, fmt.Sprintf("udp_src_min %d", c.Port)},
		{p.Dev, fmt.Sprintf("udp_src_max %d", c.Port)},
		{p.Dev, fmt.Sprintf("udp_dst_min %d", c.Port)},
		{p.Dev, fmt.Sprintf("udp_dst_max %d", c.Port)},
	}
	for _, c := range cmds {
		if err := p.write(c.file, c.cmd); err != nil {
			return err
		}
	}
	return nil
}

// SetCount changes the packet count of the configured flow.
func (p Pktgen) SetCount(n uint64) error { return p.write(p.Dev, fmt.Sprintf("count %d", n)) }

// Run sends the configured packets and returns pktgen's result. Cancelling ctx stops it.
func (p Pktgen) Run(ctx context.Context) (PktgenResult, error) {
	done := make(chan error, 1)
	go func() { done <- p.write("pgctrl", "start") }()
	select {
	case err := <-done:
		if err != nil {
			return PktgenResult{}, err
		}
	case <-ctx.Done():
		_ = p.write("pgctrl", "stop")
		<-done
		return PktgenResult{}, ctx.Err()
	}
	var out []byte
	err := p.NS.Do(func() (err error) {
		out, err = os.ReadFile(filepath.Join("/proc/thread-self/net/pktgen", p.Dev))
		return err
	})
	if err != nil {
		return PktgenResult{}, err
	}
	return ParsePktgen(string(out))
}

// Remove unbinds every device from the generator thread.
func (p Pktgen) Remove() error {
	return p.write(fmt.Sprintf("kpktgend_%d", p.Thread), "rem_device_all")
}

// SinkRuleset counts and drops the generated packets at the receiver's ingress, before
// anything else: the receiver's cost is the same for every variant.
func SinkRuleset(dev string, port uint16) string {
	return fmt.Sprintf(`table netdev sink {
	chain in {
		type filter hook ingress device %q priority 0; policy accept;
		udp dport %d counter drop comment "rx"
	}
}
`, dev, port)
}

// ChainPackets returns the packets counted by the counters of one chain, read over netlink
// inside the namespace (no nft process: under emulation that costs seconds).
func ChainPackets(n *testbed.NS, family nftables.TableFamily, table, chain string) (uint64, error) {
	var sum uint64
	err := n.Do(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		rules, err := c.GetRules(&nftables.Table{Family: family, Name: table}, &nftables.Chain{Name: chain})
		if err != nil {
			return fmt.Errorf("%s: rules of %s %s: %w", n.Name, table, chain, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if c, ok := e.(*expr.Counter); ok {
					sum += c.Packets
				}
			}
		}
		return nil
	})
	return sum, err
}

// sendUDP opens a UDP socket src -> dst in n and sends msg. The caller closes it.
func sendUDP(n *testbed.NS, src, dst netip.AddrPort, msg string) (*net.UDPConn, error) {
	c, err := n.DialUDP(src.String(), dst.String())
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// establishUDP sends one packet from src to dst and one back on the reverse tuple, so that
// conntrack on the way sees the flow ESTABLISHED (the flowtable offloads UDP only then).
func establishUDP(from, to *testbed.NS, src, dst netip.Addr, port uint16) error {
	a := netip.AddrPortFrom(src, port)
	b := netip.AddrPortFrom(dst, port)
	ca, err := sendUDP(from, a, b, "bench")
	if err != nil {
		return err
	}
	defer ca.Close()
	time.Sleep(20 * time.Millisecond)
	cb, err := sendUDP(to, b, a, "bench-reply")
	if err != nil {
		return err
	}
	defer cb.Close()
	_ = ca.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if _, err := ca.Read(buf); err != nil {
		return fmt.Errorf("reverse packet %s -> %s not received: %w", b, a, err)
	}
	return nil
}
