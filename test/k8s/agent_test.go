package k8s_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hostaccel/hostaccel/internal/k8s"
	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
	"github.com/hostaccel/hostaccel/internal/testbed"
	"github.com/hostaccel/hostaccel/test/k8s/testenv"
)

// The binary's agent in Kubernetes mode, in a network namespace of its own, against the real
// API server with the deploy/ ServiceAccount's token: the node's state follows the API through
// the same reconciler as a config file, the load balancer's table has the Service, and losing
// the API server keeps the applied state. Needs root and HOSTACCEL_BIN (a build with
// `agent --kubernetes`); skips without them.
func TestAgentKubernetes(t *testing.T) {
	requireEnv(t)
	testbed.RequireRoot(t)
	bin := os.Getenv("HOSTACCEL_BIN")
	if bin == "" {
		testbed.Skip(t, testenv.EnvRequire, "HOSTACCEL_BIN not set (the hostaccel binary to run)")
	}
	if out, _ := exec.Command(bin, "agent", "--help").CombinedOutput(); !strings.Contains(string(out), "--kubernetes ") {
		testbed.Skip(t, testenv.EnvRequire, bin+" has no `agent --kubernetes`")
	}
	ctx := context.Background()
	ns, err := testbed.NewNS("k8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	for _, cmd := range [][]string{
		{"ip", "link", "add", "antrea-gw0", "type", "veth", "peer", "name", "gw0-peer"},
		{"ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"},
		{"ip", "addr", "add", "10.244.0.1/24", "dev", "antrea-gw0"},
		{"ip", "addr", "add", "172.18.0.2/24", "dev", "eth0"},
		{"ip", "link", "set", "antrea-gw0", "up"},
		{"ip", "link", "set", "eth0", "up"},
	} {
		if _, err := ns.Exec(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	// The API server listens on the host's loopback; relay the namespace's 127.0.0.1:PORT to
	// it. TLS passes through: the certificate names 127.0.0.1.
	apiAddr := strings.TrimPrefix(env.Host, "https://")
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go testenv.Relay(l, apiAddr)

	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "deploy")
	if _, err := env.Kubectl(ctx, "apply", "--server-side", "-k", deploy); err != nil {
		t.Fatal(err)
	}
	token, err := env.ServiceAccountToken(ctx, "hostaccel-system", "hostaccel", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfigAt(kubeconfig, "https://"+l.Addr().String(), token); err != nil {
		t.Fatal(err)
	}
	// The base config is the ConfigMap, datapath none: the load balancer only, which every
	// kernel with nf_tables has, and the node's fastpath state still follows the API.
	cm, err := admin.CoreV1().ConfigMaps("hostaccel-system").Get(ctx, "hostaccel-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	baseCfg := regexp.MustCompile(`(?m)^datapath: .*$`).ReplaceAllString(cm.Data["config.yaml"], "datapath: none")
	basePath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(basePath, []byte(baseCfg), 0o644); err != nil {
		t.Fatal(err)
	}

	createNode(t, k8stest.Node("agent-node", []string{"10.244.0.0/24"}, "172.18.0.2"))
	createNode(t, k8stest.Node("peer-1", []string{"10.244.1.0/24"}, "172.18.0.3"))
	const svcNS = "agent-e2e"
	createNamespace(t, svcNS)
	svc, err := admin.CoreV1().Services(svcNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{k8s.LabelServiceProxyName: k8s.DefaultProxyName}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(svcNS).Create(ctx, k8stest.EndpointSlice(svcNS, "web", "web-1", "http", 8080,
		k8stest.Up("10.244.1.20", "peer-1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	statePath := filepath.Join(dir, "agent.json")
	agentCtx, stopAgent := context.WithCancel(ctx)
	cmd := exec.CommandContext(agentCtx, "ip", "netns", "exec", ns.Name, bin, "agent", "--kubernetes",
		"-f", basePath, "--kubeconfig", kubeconfig, "--node-name", "agent-node", "--state-file", statePath,
		"--lock-file", filepath.Join(dir, "hostaccel.lock"), "--cleanup-on-exit")
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	logFile, _ := os.Create(filepath.Join(dir, "agent.log"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopAgent()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("agent log:\n%s", b)
		}
	})

	type agentState struct {
		Syncs    int       `json:"syncs"`
		LastSync time.Time `json:"lastSync"`
		Healthy  bool      `json:"healthy"`
		Degraded []string  `json:"degraded"`
		Source   k8s.Status
	}
	state := func() agentState {
		var st agentState
		if b, err := os.ReadFile(statePath); err == nil {
			_ = json.Unmarshal(b, &st)
		}
		return st
	}
	peers := func(st agentState) []string {
		var out []string
		if st.Source.Summary != nil {
			for _, p := range st.Source.Summary.Peers {
				if p.Accelerated {
					out = append(out, p.Name)
				}
			}
		}
		return out
	}
	k8stest.WaitFor(t, "the agent's first sync", 30*time.Second, func() bool { return state().Syncs > 0 })
	nft := func() string {
		out, _ := ns.Exec("nft", "list", "table", "inet", "hostaccel-lb")
		return out
	}
	k8stest.WaitFor(t, "the Service in the load balancer's table", 10*time.Second, func() bool {
		return strings.Contains(nft(), svc.Spec.ClusterIP) && strings.Contains(nft(), "10.244.1.20")
	})
	if st := state(); !st.Healthy || !slices.Equal(peers(st), []string{"peer-1"}) {
		t.Fatalf("agent state: %+v", st)
	}

	// A Node joins: the agent's state has it, through a sync of its own. How fast is measured by
	// `hostaccel bench control-plane`, not asserted here (a loaded machine would fail a timed test).
	t0 := time.Now()
	createNode(t, k8stest.Node("peer-2", []string{"10.244.2.0/24"}, "172.18.0.4"))
	d := k8stest.WaitFor(t, "peer-2 in the agent's state", 5*time.Second, func() bool {
		st := state()
		return slices.Contains(peers(st), "peer-2") && st.LastSync.After(t0)
	})
	t.Logf("Node created -> the agent synced with it as a peer in %s", d.Round(time.Millisecond))
	// An endpoint joins: the kernel's load balancer map has it.
	t0 = time.Now()
	if _, err := admin.DiscoveryV1().EndpointSlices(svcNS).Create(ctx, k8stest.EndpointSlice(svcNS, "web", "web-2", "http", 8080,
		k8stest.Up("10.244.2.20", "peer-2")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d = k8stest.WaitFor(t, "the new backend in the kernel", 5*time.Second, func() bool { return strings.Contains(nft(), "10.244.2.20") })
	t.Logf("EndpointSlice created -> backend in table inet hostaccel-lb in %s", d.Round(time.Millisecond))

	// The API server goes away: the agent keeps the kernel as it was and says so.
	before := nft()
	env.KillAPIServer()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = env.StartAPIServer(context.Background())
		}
	})
	k8stest.WaitFor(t, "the agent reports the API server unreachable", 10*time.Second, func() bool {
		st := state()
		return !st.Source.Connected && slices.ContainsFunc(st.Degraded, func(s string) bool { return strings.Contains(s, "unreachable") })
	})
	if after := nft(); stripCounters(after) != stripCounters(before) {
		t.Errorf("the load balancer's table changed while the API server was down:\n%s\n---\n%s", before, after)
	}
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	k8stest.WaitFor(t, "the agent reconnected", 10*time.Second, func() bool { st := state(); return st.Source.Connected && len(st.Degraded) == 0 })
	deleteNode(t, "peer-1")
	k8stest.WaitFor(t, "peer-1 gone after the restart", 60*time.Second, func() bool { return !slices.Contains(peers(state()), "peer-1") })
}

var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

func stripCounters(s string) string { return counters.ReplaceAllString(s, "counter") }
