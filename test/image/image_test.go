// Package image runs the agent's container image (scripts/image.sh) with podman the way
// deploy/'s DaemonSet runs it: its host network (here the node namespace of a testbed
// topology), its security context (user, capabilities, read-only root, no privilege
// escalation), its volumes (the config mounted read-only, /run/hostaccel and
// /var/lib/hostaccel from the host), its env and its args, its probes. The pod spec is read
// from deploy/base/daemonset.yaml (and deploy/tc/'s and deploy/auto/'s patches), so a change
// there is what runs here.
//
// The image comes from HOSTACCEL_IMAGE (scripts/test.sh builds it with scripts/image.sh where
// podman is installed); without it the tests skip, unless HOSTACCEL_REQUIRE_IMAGE=1 (CI).
package image_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

const (
	envImage   = "HOSTACCEL_IMAGE"
	envRequire = "HOSTACCEL_REQUIRE_IMAGE"
)

func TestMain(m *testing.M) {
	if code, ok := testbed.MainRequireRoot("image tests"); !ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// requireImage skips (or with HOSTACCEL_REQUIRE_IMAGE=1 fails) without an image and podman.
func requireImage(t *testing.T) string {
	t.Helper()
	img := os.Getenv(envImage)
	why := ""
	if _, err := exec.LookPath("podman"); err != nil {
		why = "podman is not installed (scripts/setup.sh installs it)"
	} else if img == "" {
		why = envImage + " is not set: build the image with scripts/image.sh and set " + envImage + "=localhost/hostaccel:dev"
	} else if out, err := exec.Command("podman", "image", "exists", img).CombinedOutput(); err != nil {
		why = fmt.Sprintf("podman has no image %s (scripts/image.sh builds it): %v %s", img, err, out)
	}
	if why == "" {
		return img
	}
	if os.Getenv(envRequire) == "1" {
		t.Fatalf("%s=1: %s", envRequire, why)
	}
	t.Skip(why)
	return ""
}

func deployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// daemonSet reads a DaemonSet manifest (or a strategic-merge patch of one) under deploy/.
func daemonSet(t *testing.T, rel string) *appsv1.DaemonSet {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir(), rel))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return &ds
}

func agentContainer(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "agent" {
			return &ds.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("DaemonSet %s has no container named agent", ds.Name)
	return nil
}

// baseDaemonSet is deploy/base/daemonset.yaml with the patches under deploy/ named (e.g.
// tc/daemonset-patch.yaml), in order, as kustomize merges them: the agent container's added
// capabilities replaced, its volume mounts and the Pod's volumes appended.
func baseDaemonSet(t *testing.T, patches ...string) *appsv1.DaemonSet {
	ds := daemonSet(t, "base/daemonset.yaml")
	c := agentContainer(t, ds)
	for _, name := range patches {
		patch := daemonSet(t, name)
		pc := agentContainer(t, patch)
		if sc := pc.SecurityContext; sc != nil && sc.Capabilities != nil {
			c.SecurityContext.Capabilities.Add = sc.Capabilities.Add
		}
		c.VolumeMounts = append(c.VolumeMounts, pc.VolumeMounts...)
		ds.Spec.Template.Spec.Volumes = append(ds.Spec.Template.Spec.Volumes, patch.Spec.Template.Spec.Volumes...)
	}
	return ds
}

// node is the DaemonSet's Pod on a testbed node: its namespace and the host directories its
// volumes map to.
type node struct {
	ns      *testbed.NS
	ip      netip.Addr
	name    string
	volumes map[string]string // volume name -> host directory
}

var seq atomic.Int32

// podman runs podman and returns its combined output.
func podman(args ...string) (string, error) {
	out, err := exec.Command("podman", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// runArgs translates the DaemonSet's Pod spec into `podman run` arguments.
func runArgs(t *testing.T, ds *appsv1.DaemonSet, n *node, ctr, img string) []string {
	t.Helper()
	spec := ds.Spec.Template.Spec
	c := agentContainer(t, ds)
	if !spec.HostNetwork {
		t.Fatal("the DaemonSet does not use the host network")
	}
	args := []string{"run", "--detach", "--name", ctr,
		// hostNetwork: the node's network namespace is the testbed's node.
		"--network", "ns:/run/netns/" + n.ns.Name,
		// Kubernetes sets no per-container rlimits; podman as root raises nofile and nproc
		// to 1048576, which needs CAP_SYS_RESOURCE where the test runs (sandboxes lack it).
		"--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
		// The seccomp profile is podman's default (RuntimeDefault-like): stricter than the
		// Unconfined a DaemonSet without seccompProfile gets from a default kubelet.
	}
	// crun refuses hosts with cgroup v1 and v2 controllers mixed ("cgroups in hybrid mode not
	// supported"); runc, what most Kubernetes nodes run, does not.
	if _, err := exec.LookPath("runc"); err == nil {
		args = append(args, "--runtime", "runc")
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the agent container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Fatal("the agent container is privileged")
	}
	if sc.RunAsUser != nil {
		args = append(args, "--user", strconv.FormatInt(*sc.RunAsUser, 10))
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		// Kubernetes mounts no tmpfs on /run or /tmp; podman does unless told not to.
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	if sc.Capabilities != nil {
		for _, cp := range sc.Capabilities.Drop {
			args = append(args, "--cap-drop", string(cp))
		}
		for _, cp := range sc.Capabilities.Add {
			args = append(args, "--cap-add", string(cp))
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			switch f.FieldRef.FieldPath {
			case "spec.nodeName":
				v = n.name
			case "status.podIP": // hostNetwork: the node's address
				v = n.ip.String()
			default:
				t.Fatalf("env %s: field %s not known to the test", e.Name, f.FieldRef.FieldPath)
			}
		}
		env[e.Name] = v
		args = append(args, "--env", e.Name+"="+v)
	}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volumeMount %s has no volume", m.Name)
		}
		host := n.volumes[m.Name]
		if host == "" {
			t.Fatalf("the test has no directory for volume %s", m.Name)
		}
		var opts []string
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		switch p := m.MountPropagation; {
		case p == nil || *p == corev1.MountPropagationNone:
		case *p == corev1.MountPropagationHostToContainer:
			opts = append(opts, "rslave")
		default:
			t.Fatalf("volumeMount %s: mount propagation %s not known to the test", m.Name, *p)
		}
		v := host + ":" + m.MountPath
		if len(opts) > 0 {
			v += ":" + strings.Join(opts, ",")
		}
		args = append(args, "--volume", v)
	}
	args = append(args, img)
	// The args, with $(VAR) from the env. Kubernetes mode (--kubernetes*, --node-name) is left
	// out: the config comes from the mounted file alone (test/k8s runs that mode against a
	// real API server).
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--kubernetes") || strings.HasPrefix(a, "--node-name") {
			continue
		}
		args = append(args, ref.ReplaceAllStringFunc(a, func(s string) string { return env[ref.FindStringSubmatch(s)[1]] }))
	}
	return args
}

// probeAddr resolves a probe's HTTP port (a name or a number) to the node's address.
func probeAddr(t *testing.T, c *corev1.Container, p *corev1.Probe, ip netip.Addr) (addr, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Fatal("the agent container has no HTTP probe")
	}
	port := p.HTTPGet.Port.IntValue()
	if name := p.HTTPGet.Port.StrVal; name != "" {
		i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == name })
		if i < 0 {
			t.Fatalf("probe port %q is not a container port", name)
		}
		port = int(c.Ports[i].ContainerPort)
	}
	return netip.AddrPortFrom(ip, uint16(port)).String(), p.HTTPGet.Path
}

// pod is one running container.
type pod struct {
	t    *testing.T
	name string
	ds   *appsv1.DaemonSet
	n    *node
}

// runPod starts the DaemonSet's container on n with config as its ConfigMap's config.yaml.
func runPod(t *testing.T, img string, ds *appsv1.DaemonSet, n *node, config string) *pod {
	t.Helper()
	n.volumes = map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		dir := filepath.Join(t.TempDir(), v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case v.ConfigMap != nil:
			if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
		case v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/sys/"):
			// The host's kernel interfaces (the cgroup hierarchy, the BPF filesystem): the
			// real ones, as on a node.
			if fi, err := os.Stat(v.HostPath.Path); err != nil || !fi.IsDir() {
				t.Fatalf("volume %s: hostPath %s is no directory on this host: %v", v.Name, v.HostPath.Path, err)
			}
			dir = v.HostPath.Path
		case v.HostPath != nil:
		default:
			t.Fatalf("volume %s: only configMap and hostPath volumes are known to the test", v.Name)
		}
		n.volumes[v.Name] = dir
	}
	p := &pod{t: t, name: fmt.Sprintf("hostaccel-test-%d-%d", os.Getpid(), seq.Add(1)), ds: ds, n: n}
	args := runArgs(t, ds, n, p.name, img)
	t.Logf("podman %s", strings.Join(args, " "))
	t0 := time.Now()
	if _, err := podman(args...); err != nil {
		t.Fatal(err)
	}
	t.Logf("container started in %s", time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := podman("logs", p.name)
			t.Logf("container log:\n%s", out)
		}
		_, _ = podman("rm", "--force", "--time", "0", p.name)
	})
	return p
}

// get asks one of the container's probes, as the kubelet would (from the node).
func (p *pod) get(pr *corev1.Probe) (int, string) {
	c := agentContainer(p.t, p.ds)
	addr, path := probeAddr(p.t, c, pr, p.n.ip)
	code, body, err := p.n.ns.HTTPGet(addr, path)
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

func (p *pod) readiness() (int, string) { return p.get(agentContainer(p.t, p.ds).ReadinessProbe) }
func (p *pod) liveness() (int, string)  { return p.get(agentContainer(p.t, p.ds).LivenessProbe) }

// exec runs the image's hostaccel in the container (kubectl exec).
func (p *pod) exec(args ...string) string {
	p.t.Helper()
	out, err := podman(append([]string{"exec", p.name, "/usr/local/bin/hostaccel"}, args...)...)
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// remove stops the container as the kubelet does (SIGTERM, SIGKILL after the grace period)
// and removes it.
func (p *pod) remove() {
	p.t.Helper()
	grace := int64(30)
	if g := p.ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	t0 := time.Now()
	if _, err := podman("stop", "--time", strconv.FormatInt(grace, 10), p.name); err != nil {
		p.t.Fatal(err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		p.t.Errorf("the agent took %s to stop on SIGTERM", d.Round(time.Second))
	}
	if out, _ := podman("logs", p.name); !strings.Contains(out, "rules stay in place") {
		p.t.Errorf("the agent's log does not say that its rules stay:\n%s", out)
	}
	if _, err := podman("rm", p.name); err != nil {
		p.t.Fatal(err)
	}
}

func newNode(tp *testbed.Topo) *node {
	return &node{ns: tp.Node, ip: tp.V4.Node, name: "node-1"}
}

// transfer moves 256 KiB over TCP from the Pod to dst, served by the remote Pod at port.
func transfer(tp *testbed.Topo, dst netip.AddrPort, port int) error {
	srv, err := tp.Remote.ListenTCP(netip.AddrPortFrom(tp.V4.RemotePod, uint16(port)).String())
	if err != nil {
		return err
	}
	defer srv.Close()
	c, err := tp.Pod.DialTCP("", dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	return testbed.Transfer(c, 256<<10, 16<<10)
}

func waitReady(t *testing.T, p *pod) {
	t.Helper()
	d := testbed.WaitFor(t, "the readiness probe to answer 200", 30*time.Second, 200*time.Millisecond, func() bool {
		code, _ := p.readiness()
		return code == 200
	})
	t.Logf("ready %s after the container started", d.Round(time.Millisecond))
	if code, body := p.liveness(); code != 200 {
		t.Errorf("liveness probe: %d %s", code, body)
	}
}

// The load balancer (datapath none) with the DaemonSet's own capabilities (NET_ADMIN): the
// agent applies, the probes answer, `hostaccel status` works through exec, traffic to the VIP
// reaches the backend, and the rules stay when the container is removed (as documented).
func TestImageLoadBalancer(t *testing.T) {
	img := requireImage(t)
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	n := newNode(tp)
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80)
	cfg := fmt.Sprintf(`datapath: none
loadBalancer:
  services:
  - name: web
    vips: [%s]
    port: %d
    topology: dnat
    backends:
    - {address: %s, port: 8080}
`, vip.Addr(), vip.Port(), tp.V4.RemotePod)
	ds := baseDaemonSet(t)
	if add := agentContainer(t, ds).SecurityContext.Capabilities.Add; !slices.Equal(add, []corev1.Capability{"NET_ADMIN"}) {
		t.Logf("note: the DaemonSet adds %v", add)
	}
	p := runPod(t, img, ds, n, cfg)
	waitReady(t, p)
	if out, err := tp.Node.Exec("nft", "list", "table", "inet", "hostaccel-lb"); err != nil || !strings.Contains(out, vip.Addr().String()) {
		t.Fatalf("the load balancer's table in the node: %v\n%s", err, out)
	}
	if err := transfer(tp, vip, 8080); err != nil {
		t.Errorf("pod -> VIP %s -> backend: %v", vip, err)
	}
	st := p.exec("status")
	for _, want := range []string{"healthy", "service web (config): " + vip.Addr().String(), tp.V4.RemotePod.String() + ":8080"} {
		if !strings.Contains(st, want) {
			t.Errorf("`hostaccel status` in the container lacks %q:\n%s", want, st)
		}
	}
	// The state file is on the host (hostPath /run/hostaccel), for `hostaccel status` there.
	if _, err := os.Stat(filepath.Join(n.volumes["run"], "agent.json")); err != nil {
		t.Errorf("the agent's state file is not in the run volume: %v", err)
	}
	p.remove()
	if out, err := tp.Node.Exec("nft", "list", "table", "inet", "hostaccel-lb"); err != nil || !strings.Contains(out, vip.Addr().String()) {
		t.Errorf("the load balancer's table is gone after the container was removed: %v\n%s", err, out)
	}
	if err := transfer(tp, vip, 8080); err != nil {
		t.Errorf("pod -> VIP after the container was removed: %v", err)
	}
}

// datapath tc: the DaemonSet's NET_ADMIN alone is not enough and the readiness probe says
// which capability is missing; deploy/tc/'s NET_ADMIN + SYS_ADMIN is. With the node's
// forwarding off, traffic flows only through the tc redirect, and keeps flowing once the
// container is removed.
func TestImageTC(t *testing.T) {
	img := requireImage(t)
	caps := probe.Run(t.Context())
	if !(caps.Has(probe.TCX) || caps.Has(probe.ClsBPF)) || !caps.Has(probe.RedirectNeigh) {
		testbed.Skip(t, testbed.RequireTC, "this kernel cannot run the tc datapath")
	}
	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := tp.Node.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	a := tp.V4
	cfg := fmt.Sprintf(`datapath: tc
node:
  gateways: [%s]
  transports: [%s]
  localPodCIDRs: [%s]
  peerPodCIDRs: [%s]
  nodeIPs: [%s]
  peerNodeIPs: [%s]
classes: {pod-to-pod: true}
agent: {resyncPeriod: 2s, minSyncInterval: 100ms}
`, tp.GatewayName, tp.TransportName, a.PodCIDR, a.RemotePodCIDR, a.Node, a.Remote)
	remotePod := func(port int) netip.AddrPort { return netip.AddrPortFrom(a.RemotePod, uint16(port)) }

	n := newNode(tp)
	p := runPod(t, img, baseDaemonSet(t), n, cfg)
	testbed.WaitFor(t, "the readiness probe to answer after the first sync", 30*time.Second, 200*time.Millisecond, func() bool {
		code, body := p.readiness()
		return code != 0 && !strings.Contains(body, "not synced yet")
	})
	code, body := p.readiness()
	if code != 503 || !strings.Contains(body, "CAP_SYS_ADMIN") {
		t.Errorf("tc with the base DaemonSet's capabilities: readiness %d %q, want 503 naming CAP_SYS_ADMIN", code, body)
	}
	old := testbed.IOTimeout
	testbed.IOTimeout = 2 * time.Second // a failure is expected: do not wait 10 s for it
	if err := transfer(tp, remotePod(5200), 5200); err == nil {
		t.Error("traffic crossed a node with forwarding off and no tc datapath")
	}
	testbed.IOTimeout = old
	p.remove()

	p = runPod(t, img, baseDaemonSet(t, "tc/daemonset-patch.yaml"), n, cfg)
	waitReady(t, p)
	if err := transfer(tp, remotePod(5201), 5201); err != nil {
		t.Errorf("no traffic through the tc redirect: %v", err)
	}
	if st := p.exec("status"); !strings.Contains(st, "tc datapath:") || !strings.Contains(st, "pod-to-pod") {
		t.Errorf("`hostaccel status` in the container:\n%s", st)
	}
	p.remove()
	if err := transfer(tp, remotePod(5202), 5202); err != nil {
		t.Errorf("the tc redirect stopped with the container (its rules should stay): %v", err)
	}
}

// datapath sockmap, which deploy/auto/ gives local-pod-to-pod with sockmap.auto: true: with deploy/tc/'s capabilities
// alone the container sees only its own cgroup (its cgroup namespace), and the readiness probe
// says that the cgroup v2 root is not found; with deploy/auto/'s mounts of the host's
// /sys/fs/cgroup and /sys/fs/bpf the agent attaches to the root, TCP between two Pods of the
// node is moved socket to socket, and the sockhash is pinned in the host's BPF filesystem:
// once the container is removed, a new connection is still moved.
func TestImageSockmap(t *testing.T) {
	img := requireImage(t)
	if caps := probe.Run(t.Context()); !caps.Has(probe.SockMap) {
		t.Skip("this kernel cannot run the sockmap datapath")
	}
	hostBPFFS(t)
	pods := testbed.NewLocalPodsT(t)
	m := sockmap.NewManager()
	t.Cleanup(func() {
		if err := m.Remove(context.Background()); err != nil {
			t.Errorf("removing the sockmap datapath: %v", err)
		}
	})
	cfg := fmt.Sprintf(`datapath: sockmap
node:
  gateways: [gwa, gwb]
  transports: auto
  localPodCIDRs: [%s]
classes: {local-pod-to-pod: true}
agent: {resyncPeriod: 2s, minSyncInterval: 100ms}
`, strings.Join(slices.Collect(func(yield func(string) bool) {
		for _, c := range pods.CIDRs {
			if !yield(strconv.Quote(c.String())) {
				return
			}
		}
	}), ", "))
	// moved connects Pod A to Pod B and reports whether the transfer's messages were moved.
	moved := func(when string) {
		t.Helper()
		srv, err := pods.B.ListenTCP(netip.AddrPortFrom(pods.B4, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		before, err := m.Status(t.Context())
		if err != nil || before == nil {
			t.Fatalf("%s: sockmap status: %v %v", when, before, err)
		}
		c, err := pods.A.DialTCP("", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := testbed.Transfer(c, 256<<10, 16<<10); err != nil {
			t.Errorf("%s: Pod A -> Pod B: %v", when, err)
		}
		after, err := m.Status(t.Context())
		if err != nil || after == nil {
			t.Fatalf("%s: sockmap status: %v %v", when, after, err)
		}
		if n := after.Redirected.Count - before.Redirected.Count; n == 0 {
			t.Errorf("%s: no message moved socket to socket (status %+v)", when, *after)
		}
	}

	n := &node{ns: pods.Node, ip: pods.Addr(false, false).Prev(), name: "node-1"} // gwa's address
	p := runPod(t, img, baseDaemonSet(t, "tc/daemonset-patch.yaml"), n, cfg)
	testbed.WaitFor(t, "the readiness probe to answer after the first sync", 30*time.Second, 200*time.Millisecond, func() bool {
		code, body := p.readiness()
		return code != 0 && !strings.Contains(body, "not synced yet")
	})
	if code, body := p.readiness(); code != 503 || !strings.Contains(body, "cgroup") {
		t.Errorf("sockmap without the host's cgroup hierarchy: readiness %d %q, want 503 saying the cgroup v2 root is not found", code, body)
	}
	p.remove()

	p = runPod(t, img, baseDaemonSet(t, "tc/daemonset-patch.yaml", "auto/daemonset-patch.yaml"), n, cfg)
	waitReady(t, p)
	moved("with the agent in its container")
	if st := p.exec("status"); !strings.Contains(st, "sockmap datapath:") {
		t.Errorf("`hostaccel status` in the container:\n%s", st)
	}
	p.remove()
	pins, _ := filepath.Glob(filepath.Join(sockmap.DefaultBPFFS, "hostaccel", "sockmap-*"))
	if len(pins) == 0 {
		t.Errorf("no sockhash pin in the host's %s/hostaccel after the container was removed", sockmap.DefaultBPFFS)
	}
	moved("after the container was removed")
}

// hostBPFFS makes sure the host has the BPF filesystem at /sys/fs/bpf, as systemd mounts it on
// a node, and unmounts it when the test ends if it mounted it.
func hostBPFFS(t *testing.T) {
	t.Helper()
	if fs, err := sockmap.BPFFS(); err == nil && fs == sockmap.DefaultBPFFS {
		return
	}
	if err := unix.Mount("bpf", sockmap.DefaultBPFFS, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting the BPF filesystem at %s: %v", sockmap.DefaultBPFFS, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(sockmap.DefaultBPFFS, 0); err != nil {
			t.Errorf("unmounting %s: %v", sockmap.DefaultBPFFS, err)
		}
	})
}
