package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hostaccel/hostaccel/internal/k8s"
	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
	"github.com/hostaccel/hostaccel/internal/testbed"
	"github.com/hostaccel/hostaccel/test/k8s/testenv"
)

// k8sScale runs the agent in Kubernetes mode against the real API server of test/k8s (etcd and
// kube-apiserver on loopback, scripts/k8s-build-test-bins.sh) holding r.n Services, each with
// an EndpointSlice of two ready endpoints, and r.n/5 Nodes. The agent runs in a network
// namespace of its own with datapath none (the load balancer has every Service; the Nodes
// feed the peer set). It measures the agent's start until every Service is in the kernel, an
// endpoint going not ready and ready again until the kernel's transaction for its Service (seen
// by `nft monitor`: no polling, which at thousands of services would cost nft a second a
// look), a Node created until the agent's state has it as a peer, the agent's memory, and the
// LIST and WATCH requests the API server served while the changes ran (a relist would show).
func (r *cpRun) k8sScale(ctx context.Context) error {
	binDir, err := testenv.BinDir()
	if err != nil {
		return err
	}
	// A repetition starts from an empty directory: etcd's data and the certificates of the
	// last one would hold its Services and no longer match its CA.
	envDir := filepath.Join(r.dir, fmt.Sprintf("k8s-%d", r.n))
	if err := os.RemoveAll(envDir); err != nil {
		return err
	}
	env, err := testenv.Start(ctx, binDir, envDir)
	if err != nil {
		return fmt.Errorf("start the API server: %w", err)
	}
	defer env.Stop()
	admin, err := env.AdminClient()
	if err != nil {
		return err
	}
	services, nodes := r.n, max(r.n/5, 2)
	const benchNS, self = "bench", "bench-node"
	t0 := time.Now()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	nodeName := func(j int) string {
		if j == 0 {
			return self
		}
		return "peer-" + strconv.Itoa(j)
	}
	// Node j: Pod CIDR 10.(1+j/256).(j%256).0/24, InternalIP 172.(18+j/256).(j%256).1.
	podIP := func(j, host int) string { return fmt.Sprintf("10.%d.%d.%d", 1+j>>8, j&255, host) }
	node := func(j int) *corev1.Node {
		return k8stest.Node(nodeName(j), []string{podIP(j, 0) + "/24"}, fmt.Sprintf("172.%d.%d.1", 18+j>>8, j&255))
	}
	if err := parallel(ctx, nodes, func(j int) error {
		_, err := admin.CoreV1().Nodes().Create(ctx, node(j), metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create Nodes: %w", err)
	}
	// Service i: two endpoints on Node i%nodes, hosts 2+2*(i/nodes) and the next.
	endpoints := func(i int, readyFirst bool) []k8stest.Endpoint {
		j, h := i%nodes, 2+2*(i/nodes)
		a, b := k8stest.Up(podIP(j, h), nodeName(j)), k8stest.Up(podIP(j, h+1), nodeName(j))
		if !readyFirst {
			a = k8stest.NotReady(podIP(j, h), nodeName(j))
		}
		return []k8stest.Endpoint{a, b}
	}
	svcName := func(i int) string { return "s" + strconv.Itoa(i) }
	if err := parallel(ctx, services, func(i int) error {
		_, err := admin.CoreV1().Services(benchNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Labels: map[string]string{k8s.LabelServiceProxyName: k8s.DefaultProxyName}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_, err = admin.DiscoveryV1().EndpointSlices(benchNS).Create(ctx,
			k8stest.EndpointSlice(benchNS, svcName(i), svcName(i)+"-1", "http", 8080, endpoints(i, true)...), metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create Services: %w", err)
	}
	r.said = append(r.said, fmt.Sprintf("%d Nodes, %d Services with EndpointSlices created in %.0fs", nodes, services, time.Since(t0).Seconds()))

	ns, err := testbed.NewNS("cpk")
	if err != nil {
		return err
	}
	defer ns.Close()
	r.ns = ns.Name
	// The API server listens on the host's loopback: relay the namespace's loopback to it.
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		return err
	}
	defer l.Close()
	go testenv.Relay(l, strings.TrimPrefix(env.Host, "https://"))
	kubeconfig := filepath.Join(r.dir, "kubeconfig")
	if err := env.WriteKubeconfigAt(kubeconfig, "https://"+l.Addr().String(), env.AdminToken); err != nil {
		return err
	}
	base, err := r.write("k8s-base.yaml", "datapath: none\n")
	if err != nil {
		return err
	}

	before, err := apiRequests(ctx, env.AdminConfig()) // the API server's own watches
	if err != nil {
		return err
	}
	mon, err := startMonitor(ctx, ns.Name)
	if err != nil {
		return err
	}
	defer mon.stop()
	statePath := filepath.Join(r.dir, "agent-state.json")
	_ = os.Remove(statePath)
	start := time.Now()
	agent, err := r.startAgent(ctx, ns.Name, "--kubernetes", "-f", base,
		"--kubeconfig", kubeconfig, "--node-name", self, "--state-file", statePath, "--lock-file", filepath.Join(r.dir, "lock"))
	if err != nil {
		return err
	}
	defer func() { agent.stop(); r.keepLog(agent) }()

	// The time is when the listing that found them all began (it was after it returned, and
	// a second's sleep between listings: ~1 s plus a listing whatever the agent took).
	up := r.rep.cell(r.part, r.n, "agent start until every Service is in the kernel")
	for {
		asked := time.Now()
		out, err := r.sh(ctx, true, "", "nft", "list", "map", "inet", "hostaccel-lb", "services-v4")
		if err == nil && strings.Count(out, " : goto ") >= services {
			up.Seconds = append(up.Seconds, asked.Sub(start).Seconds())
			break
		}
		if time.Since(start) > r.o.Timeout || agent.cmd.ProcessState != nil {
			up.Seconds = append(up.Seconds, math.NaN())
			up.Errors = append(up.Errors, "not every Service in the kernel: "+firstLines(agent.log.String(), 2))
			return errors.New("agent start: timed out")
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the start's read-back and first resync pass

	apiLoad0, err := apiRequests(ctx, env.AdminConfig())
	if err != nil {
		return err
	}
	down := r.rep.cell(r.part, r.n, "endpoint not ready until its Service's kernel transaction")
	back := r.rep.cell(r.part, r.n, "endpoint ready again until its Service's kernel transaction")
	for k := range 10 {
		i := (k*7919 + 11) % services
		name := k8s.LBName(benchNS, svcName(i), "http", k8s.FrontCluster)
		for _, ready := range []bool{false, true} {
			cell := down
			if ready {
				cell = back
			}
			es := k8stest.EndpointSlice(benchNS, svcName(i), svcName(i)+"-1", "http", 8080, endpoints(i, ready)...)
			cur, err := admin.DiscoveryV1().EndpointSlices(benchNS).Get(ctx, es.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			es.ResourceVersion = cur.ResourceVersion
			seen := mon.expect(name)
			t1 := time.Now()
			if _, err := admin.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
				return err
			}
			cell.await(seen, t1, name)
			// Apart from the next change by more than the agent's minSyncInterval (1s): each
			// change is an event after a quiet spell, not one of a burst.
			time.Sleep(1500 * time.Millisecond)
		}
	}

	joined := r.rep.cell(r.part, r.n, "Node created until the agent's state has it as a peer")
	for k := range 5 {
		j := nodes + k
		time.Sleep(1500 * time.Millisecond) // past minSyncInterval, as above
		t1 := time.Now()
		if _, err := admin.CoreV1().Nodes().Create(ctx, node(j), metav1.CreateOptions{}); err != nil {
			return err
		}
		for {
			if hasPeer(statePath, nodeName(j)) {
				joined.Seconds = append(joined.Seconds, time.Since(t1).Seconds())
				break
			}
			if time.Since(t1) > 30*time.Second {
				joined.Seconds = append(joined.Seconds, math.NaN())
				joined.Errors = append(joined.Errors, nodeName(j)+" not a peer within 30s")
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	apiLoad1, err := apiRequests(ctx, env.AdminConfig())
	if err != nil {
		return err
	}
	rss, hwm := procMemMiB(agent.cmd.Process.Pid)
	up.MaxRSSMiB = append(up.MaxRSSMiB, hwm)
	var load []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range apiLoad1 {
			if !yield(k) {
				return
			}
		}
	}) {
		if strings.HasPrefix(k, "open ") {
			load = append(load, fmt.Sprintf("%s %d (%d before the agent)", k, apiLoad1[k], before[k]))
		} else {
			load = append(load, fmt.Sprintf("%s +%d", k, apiLoad1[k]-apiLoad0[k]))
		}
	}
	up.Output = fmt.Sprintf("agent resident %.0f MiB (peak %.0f); API server, LIST and WATCH requests done while the changes ran and watches open at the end: %s", rss, hwm, strings.Join(load, ", "))
	r.said = append(r.said, fmt.Sprintf("up %.1fs, %s", up.Seconds[len(up.Seconds)-1], up.Output))
	return nil
}

// parallel runs fn(0..n-1) on 16 workers; the first error stops it and is returned.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 0; i < n && gctx.Err() == nil; i++ {
		g.Go(func() error { return fn(i) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// monitor follows `nft monitor` in a namespace: expect(s) returns a channel that receives the
// time the first event line holding s arrives.
type monitor struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	want map[string]chan time.Time
}

func startMonitor(ctx context.Context, ns string) (*monitor, error) {
	m := &monitor{cmd: exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "monitor"), want: map[string]chan time.Time{}}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			now, line := time.Now(), sc.Text()
			m.mu.Lock()
			for s, ch := range m.want {
				if strings.Contains(line, s) {
					ch <- now
					delete(m.want, s)
				}
			}
			m.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	return m, nil
}

func (m *monitor) expect(s string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	m.mu.Lock()
	m.want[s] = ch
	m.mu.Unlock()
	return ch
}

// await records the time from since until seen says nft monitor showed the transaction of
// name (a failure after 30 s).
func (c *CPCell) await(seen <-chan time.Time, since time.Time, name string) {
	select {
	case at := <-seen:
		c.Seconds = append(c.Seconds, at.Sub(since).Seconds())
	case <-time.After(30 * time.Second):
		c.Seconds = append(c.Seconds, math.NaN())
		c.Errors = append(c.Errors, "no kernel transaction for "+name+" within 30s")
	}
}

func (m *monitor) stop() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// apiRequests sums the API server's LIST and WATCH requests for nodes, services and
// endpointslices (apiserver_request_total), by verb and resource.
func apiRequests(ctx context.Context, cfg *rest.Config) (map[string]int, error) {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	body, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server /metrics: %w", err)
	}
	return parseAPIRequests(string(body)), nil
}

// parseAPIRequests sums apiserver_request_total (requests done) of a /metrics body for LIST and
// WATCH of nodes, services and endpointslices, by "VERB resource", and
// apiserver_longrunning_requests (watches open now) as "open WATCH resource".
func parseAPIRequests(body string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(body, "\n") {
		metric, _, _ := strings.Cut(line, "{")
		if metric != "apiserver_request_total" && metric != "apiserver_longrunning_requests" {
			continue
		}
		labels, value, _ := strings.Cut(line, "} ")
		label := func(k string) string {
			_, v, ok := strings.Cut(labels, k+`="`)
			if !ok {
				return ""
			}
			v, _, _ = strings.Cut(v, `"`)
			return v
		}
		verb, res := label("verb"), label("resource")
		if (verb != "LIST" && verb != "WATCH") || (res != "nodes" && res != "services" && res != "endpointslices") {
			continue
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if metric == "apiserver_longrunning_requests" {
			verb = "open " + verb // a gauge: the watches open now
		}
		out[verb+" "+res] += int(v)
	}
	return out
}

// hasPeer reports whether the agent's state file lists node as an accelerated peer.
func hasPeer(path, node string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var st struct {
		Source k8s.Status `json:"source"`
	}
	if json.Unmarshal(b, &st) != nil || st.Source.Summary == nil {
		return false
	}
	return slices.ContainsFunc(st.Source.Summary.Peers, func(p k8s.Peer) bool { return p.Name == node })
}

// procMemMiB is a process's resident memory and its peak, in MiB.
func procMemMiB(pid int) (rss, hwm float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return math.NaN(), math.NaN()
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}
