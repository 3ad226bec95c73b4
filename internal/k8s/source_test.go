package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
)

// Unit tests of the Source against client-go's fake clientset; test/k8s runs the same against
// a real API server.

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startSource(t *testing.T, c *fake.Clientset, opts Options) *Source {
	t.Helper()
	opts.NodeName = "self"
	opts.Log = quietLog()
	opts.ProbeInterval = 50 * time.Millisecond
	opts.Debounce = 10 * time.Millisecond
	opts.FilePollInterval = 50 * time.Millisecond
	if opts.BaseConfigPath == "" {
		opts.BaseConfigPath = filepath.Join(t.TempDir(), "base.yaml")
		if err := os.WriteFile(opts.BaseConfigPath, []byte(baseYAML), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	k8stest.Run(t, s, 10*time.Second)
	return s
}

// eventually polls cond until it holds or 5s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	k8stest.WaitFor(t, what, 5*time.Second, cond)
}

func TestSourceFollowsNodes(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	s := startSource(t, c, Options{})
	peers := func() []string {
		cfg, err := s.Config()
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Node.PeerPodCIDRs
	}
	if got := peers(); !slices.Equal(got, []string{"10.244.1.0/24"}) {
		t.Fatalf("peers = %v", got)
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, node("n2", []string{"10.244.2.0/24"}, "172.18.0.4"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n2 to join the peers", func() bool { return slices.Equal(peers(), []string{"10.244.1.0/24", "10.244.2.0/24"}) })
	// Report is the status as JSON (the summary written once per derivation).
	eventually(t, "Report to be json.Marshal(Status())", func() bool {
		want, _ := json.Marshal(s.Status())
		got, _ := s.Report().(json.RawMessage)
		return string(got) == string(want) && strings.Contains(string(got), `"peers":[{"name":"n1"`)
	})
	select {
	case <-s.Changed():
	default:
		t.Error("Changed did not fire")
	}
	if err := c.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1 to leave the peers", func() bool { return slices.Equal(peers(), []string{"10.244.2.0/24"}) })

	// A heartbeat-like update changes nothing derived and does not count as a change.
	before := s.Status().Changes
	n2, _ := c.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{})
	n2.Status.Conditions = append(n2.Status.Conditions, corev1NodeReady())
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if after := s.Status().Changes; after != before {
		t.Errorf("a condition update changed the config (%d -> %d changes)", before, after)
	}
}

func TestSourceKeepsLastGoodConfig(t *testing.T) {
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	base := filepath.Join(t.TempDir(), "base.yaml")
	if err := os.WriteFile(base, []byte(baseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startSource(t, c, Options{BaseConfigPath: base})
	good, _ := s.Config()
	// A broken base config (a ConfigMap edit gone wrong) is rejected; the last good one stays
	// and the notes say so.
	if err := os.WriteFile(base, []byte(baseYAML+"bogus: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bad base config to be noticed", func() bool { return len(s.Notes()) > 0 })
	if n := s.Notes(); !strings.Contains(n[0], "keeping the last good config") || !strings.Contains(n[0], "bogus") {
		t.Errorf("notes = %q", n)
	}
	if cfg, _ := s.Config(); cfg != good {
		t.Error("the config changed after a bad base config")
	}
	if err := os.WriteFile(base, []byte(strings.Replace(baseYAML, "pod-to-service: true", "pod-to-service: false", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fixed base config to apply", func() bool {
		cfg, _ := s.Config()
		return len(s.Notes()) == 0 && !cfg.Classes["pod-to-service"]
	})
}

func TestSourceConnectivity(t *testing.T) {
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	var down atomic.Bool
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	s := startSource(t, c, Options{})
	eventually(t, "connected", func() bool { return s.Status().Connected })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	if v := metricValue(t, reg, "hostaccel_kubernetes_connected"); v != 1 {
		t.Errorf("hostaccel_kubernetes_connected = %v", v)
	}
	cfg, _ := s.Config()

	down.Store(true)
	eventually(t, "disconnected", func() bool { return !s.Status().Connected })
	st := s.Status()
	if st.DisconnectedSince.IsZero() || !strings.Contains(st.LastAPIError, "connection refused") {
		t.Errorf("status while down: %+v", st)
	}
	if n := s.Notes(); len(n) != 1 || !strings.Contains(n[0], "unreachable since") || !strings.Contains(n[0], "keeping the last applied state") {
		t.Errorf("notes while down = %q", n)
	}
	if got, err := s.Config(); err != nil || got != cfg {
		t.Errorf("config while down: %v, %v", got, err)
	}
	if v := metricValue(t, reg, "hostaccel_kubernetes_connected"); v != 0 {
		t.Errorf("hostaccel_kubernetes_connected while down = %v", v)
	}

	down.Store(false)
	eventually(t, "reconnected", func() bool { return s.Status().Connected && len(s.Notes()) == 0 })
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestNewValidates(t *testing.T) {
	c := fake.NewClientset()
	for _, o := range []Options{{}, {NodeName: "n", Peers: "some"}, {NodeName: "n", Services: "most"}} {
		if _, err := New(c, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func corev1NodeReady() corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}
}

func metricValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// A derivation's log line lists a few peer CIDRs, and counts many.
func TestLogLineCountsLongLists(t *testing.T) {
	few := []string{"10.1.0.0/24", "10.1.1.0/24"}
	if got := fewOrCount(few); !reflect.DeepEqual(got, few) {
		t.Fatalf("fewOrCount(%v) = %v", few, got)
	}
	many := make([]string, 5000)
	if got := fewOrCount(many); got != "5000 entries" {
		t.Fatalf("fewOrCount of 5,000 = %v", got)
	}
}

// Under same-subnet peers, the transport subnets are looked at again without an API event:
// an address that comes late at boot brings the peers on its subnet within a probe interval.
func TestSourceFollowsLocalSubnets(t *testing.T) {
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"), node("n1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	var up atomic.Bool
	s := startSource(t, c, Options{Peers: PeersSameSubnet, LocalSubnets: func([]netip.Addr) ([]netip.Prefix, error) {
		if !up.Load() {
			return nil, errors.New("no address holds 172.18.0.2 yet")
		}
		return []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24")}, nil
	}})
	peers := func() []string {
		cfg, err := s.Config()
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Node.PeerPodCIDRs
	}
	if got := peers(); len(got) != 0 {
		t.Fatalf("peers before the node has its address: %v", got)
	}
	up.Store(true)
	eventually(t, "n1 to join the peers once the address is there", func() bool { return slices.Equal(peers(), []string{"10.244.1.0/24"}) })
}

// With same-subnet peers and a base config that does not parse, watchSubnets does not derive
// again at every tick: the subnets are recorded before the base is read (before, a failed
// derivation left them unrecorded, and each tick saw them "changed").
func TestWatchSubnetsQuietOnBadBase(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base.yaml")
	os.WriteFile(base, []byte("not: [valid"), 0o644)
	c := fake.NewClientset(node("self", []string{"10.244.0.0/24"}, "172.18.0.2"))
	s, err := New(c, Options{NodeName: "self", Log: quietLog(), BaseConfigPath: base, Peers: PeersSameSubnet,
		ProbeInterval: 50 * time.Millisecond, Debounce: 10 * time.Millisecond, FilePollInterval: 50 * time.Millisecond,
		LocalSubnets: func([]netip.Addr) ([]netip.Prefix, error) {
			return []netip.Prefix{netip.MustParsePrefix("172.18.0.0/24")}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	time.Sleep(300 * time.Millisecond)
	d0 := s.Status().Derivations
	time.Sleep(time.Second)
	d1 := s.Status().Derivations
	cancel()
	<-done
	if d1-d0 > 2 {
		t.Errorf("%d derivations in 1s with nothing changed (bad base; err %q)", d1-d0, s.Status().DeriveError)
	}
}

// A zone label set on this Node after the agent started (the cloud controller manager labels
// a Node after it registers) must take effect: kube-proxy's NodeTopologyConfig re-syncs on a
// topology label change. Before, the Source ignored Node updates that changed only labels.
func TestZoneLabelChangeRederives(t *testing.T) {
	ctx := context.Background()
	self := node("self", []string{"10.244.0.0/24"}, "172.18.0.2")
	web := service("default", "web", corev1.ServiceTypeClusterIP, "10.96.0.10", port("http", 80, 8080, 0))
	es := slice("default", "web", "web-a", "http", 8080, up("10.244.1.1", "n1"), up("10.244.2.1", "n2"))
	es.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	es.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	c := fake.NewClientset(self, web, es)
	s := startSource(t, c, Options{})
	backends := func() []string {
		var out []string
		if d := s.Derived(); d != nil {
			for _, f := range d.Summary.Balanced {
				if f.Front == FrontCluster {
					for _, b := range f.Backends {
						out = append(out, b.Address)
					}
				}
			}
		}
		slices.Sort(out)
		return out
	}
	eventually(t, "both endpoints (no zone yet)", func() bool { return slices.Equal(backends(), []string{"10.244.1.1", "10.244.2.1"}) })
	n := self.DeepCopy()
	n.Labels = map[string]string{corev1.LabelTopologyZone: "zone-a"}
	if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Equal(backends(), []string{"10.244.1.1"}) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("after this Node got zone-a, the cluster front still has %v; want [10.244.1.1] (zone-a's)", backends())
}
