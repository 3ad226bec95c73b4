package reliability

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/probe"
)

var ftDevices = regexp.MustCompile(`devices = \{ ([^}]*) \}`)

// flowtableDevices lists the flowtable's devices, sorted, from nft (cheap enough to poll under
// TCG, unlike a whole status).
func (n *node) flowtableDevices(t *testing.T) []string {
	t.Helper()
	out, err := n.Node.Exec("nft", "list", "flowtable", "inet", flowtable.TableName, flowtable.FlowtableName)
	if err != nil {
		return nil
	}
	m := ftDevices.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	devs := strings.Split(m[1], ", ")
	slices.Sort(devs)
	return devs
}

// flowtableStatus returns the flowtable's devices and the connections conntrack shows offloaded.
func (n *node) flowtableStatus(t *testing.T) (devices []string, offloaded int) {
	t.Helper()
	st := n.status(t)
	if st.Table != nil && st.Table.Flowtables[flowtable.FlowtableName] != nil {
		devices = st.Table.Flowtables[flowtable.FlowtableName].Devices
	}
	return devices, len(st.Offloaded)
}

// The flowtable's transport deleted and re-created 100 times under traffic (the known trap: a
// vanished device in a flowtable fails the whole nft transaction): the agent prunes and adds
// devices every time, never dies, and offloads new connections over the new device at the end.
// It needs the nftables flowtable: scripts/test.sh runs it in the VM on kernels without it.
func TestFlowtableChurn(t *testing.T) {
	if !caps.Has(probe.Flowtable) {
		if os.Getenv("HOSTACCEL_IN_VM") == "1" || os.Getenv("HOSTACCEL_REQUIRE_FLOWTABLE") == "1" {
			t.Fatalf("no flowtable here: %s", caps.Get(probe.Flowtable).Detail)
		}
		t.Skip("this kernel has no nftables flowtable; scripts/test.sh runs this test in the VM")
	}
	// 100 cycles: under TCG (the VM) 5m41s on an idle 2-core machine, 3.4 s per cycle (two
	// syncs of an agent emulated instruction by instruction); HOSTACCEL_CHURN_CYCLES sets fewer
	// or more.
	cycles := 100
	if v, err := strconv.Atoi(os.Getenv("HOSTACCEL_CHURN_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	n := setupNode(t)
	n.writeConfig(t, fmt.Sprintf(`datapath: flowtable
classes: {pod-to-pod: true}
node:
  gateways: [%s]
  transports: auto
  localPodCIDRs: [%s, "%s"]
  peerPodCIDRs: [%s, "%s"]
agent: {resyncPeriod: 2s, minSyncInterval: 200ms}
`, n.GatewayName, n.V4.PodCIDR, n.V6.PodCIDR, n.V4.RemotePodCIDR, n.V6.RemotePodCIDR))
	a := n.startAgent(t)
	const slow = 60 * time.Second // TCG
	both := func() bool { return slices.Equal(n.flowtableDevices(t), []string{n.TransportName, n.GatewayName}) }
	waitFor(t, "the flowtable on both devices", slow, both)
	s := startStream(t, n.Pod, netip.AddrPortFrom(n.V4.RemotePod, uint16(bePort)))
	var g0, m0 float64
	var worst, total time.Duration
	t0 := time.Now()
	for i := range cycles {
		if out, err := n.Node.Exec("ip", "link", "del", n.TransportName); err != nil {
			t.Fatal(err, out)
		}
		waitFor(t, fmt.Sprintf("cycle %d: the vanished device pruned", i), slow, func() bool {
			return slices.Equal(n.flowtableDevices(t), []string{n.GatewayName})
		})
		if err := n.RecreateTransport(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, fmt.Sprintf("cycle %d: the re-created device added", i), slow, both)
		d := time.Since(start)
		worst, total = max(worst, d), total+d
		if !a.alive() {
			t.Fatalf("cycle %d: the agent died", i)
		}
		if i%10 == 9 {
			fmt.Printf("flowtable churn: %d cycles in %s\n", i+1, time.Since(t0).Round(time.Second))
		}
		if i == 9 {
			g0, m0 = n.metric(t, "go_goroutines"), float64(rss(a.pid()))
		}
	}
	serr, stall := s.close()
	c, err := n.Pod.DialTCP("", netip.AddrPortFrom(n.V4.RemotePod, uint16(bePort)).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	offloaded := 0
	waitFor(t, "a new connection offloaded over the new device", slow, func() bool {
		if err := exchangeOn(c); err != nil {
			t.Fatal(err)
		}
		_, offloaded = n.flowtableStatus(t)
		return offloaded > 0
	})
	time.Sleep(2 * time.Second)
	g1, m1 := n.metric(t, "go_goroutines"), float64(rss(a.pid()))
	st := n.readState()
	figure(t, "cycles", cycles, "crashes", 0, "sync_errors", st.SyncErrors, "syncs", st.Syncs,
		"readd_mean_ms", total.Milliseconds()/int64(cycles), "readd_worst_ms", worst.Milliseconds(),
		"goroutines", fmt.Sprintf("%.0f->%.0f", g0, g1), "rss_mib", fmt.Sprintf("%.1f->%.1f", m0/(1<<20), m1/(1<<20)),
		"stream_survived", serr == nil, "stream_longest_stall_ms", stall.Milliseconds(), "offloaded_after", offloaded)
	if g0 <= 0 || g1 > g0+10 {
		t.Errorf("goroutines grew: %.0f after 10 cycles, %.0f after %d", g0, g1, cycles)
	}
	if m1 > m0*1.3+16<<20 {
		t.Errorf("resident memory grew: %.1f MiB after 10 cycles, %.1f MiB after %d", m0/(1<<20), m1/(1<<20), cycles)
	}
	if st.SyncErrors > cycles || !st.Healthy {
		t.Errorf("after churn: %d sync errors in %d cycles, state %+v", st.SyncErrors, cycles, st)
	}
	if strings.Contains(a.log.String(), "panic") {
		t.Error("the agent logged a panic")
	}
}
