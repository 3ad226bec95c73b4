package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// checkClean fails unless nothing of this process's beds is left: no namespace, no link in
// the root namespace that was not there before, no record.
func checkClean(t *testing.T, prefix string, linksBefore []string) {
	t.Helper()
	testbed.CheckNoLeaks(t, prefix, linksBefore)
	recs, _ := filepath.Glob(filepath.Join(RecordDir, strconv.Itoa(os.Getpid())+".*"))
	if len(recs) > 0 {
		t.Errorf("records left: %v", recs)
	}
}

func TestBuildAndClose(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	b, err := Build(context.Background(), ClusterPlan(3, 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(b.Names()); got != 10 {
		t.Errorf("%d namespaces, want fabric + 3 nodes + 3 pods + ext + direct pair", got)
	}
	if err := b.Start(RoleServerPod, "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	pids := b.PIDs()
	// The Pod reaches the other node's Pod through both nodes (the plan's checks did TCP).
	if err := b.check(context.Background(), CheckSpec{From: RoleClientPod, To: "pod3", Addr: podIP(3)}); err != nil {
		t.Errorf("pod1 -> pod3: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still there after Close", pid)
		}
	}
	checkClean(t, testbed.NamePrefix(), before)
}

// A step failing halfway (a route via an unreachable gateway, after namespaces and links
// exist) removes everything built so far.
func TestBuildFailureTearsDown(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	p := PktgenPlan(0)
	p.Routes = append(p.Routes, RouteSpec{Role: RoleGen, Dst: netip.MustParsePrefix("10.99.0.0/16"), Via: netip.MustParseAddr("192.0.2.1")})
	b, err := Build(context.Background(), p)
	if err == nil {
		b.Close()
		t.Fatal("Build succeeded with an unreachable gateway")
	}
	if !strings.Contains(err.Error(), "route 10.99.0.0/16") {
		t.Errorf("error does not name the step: %v", err)
	}
	checkClean(t, testbed.NamePrefix(), before)
}

func TestBuildCancelled(t *testing.T) {
	testbed.RequireRoot(t)
	before := testbed.RootLinks(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Build(ctx, ClusterPlan(2, 0)); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	checkClean(t, testbed.NamePrefix(), before)
}

// A bench process interrupted with SIGINT while netperf runs removes everything it made:
// its namespaces, the netservers, the nft tables with them.
func TestInterruptTearsDown(t *testing.T) {
	testbed.RequireRoot(t)
	if _, err := exec.LookPath("netperf"); err != nil {
		t.Skip("netperf not installed")
	}
	before := testbed.RootLinks(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperInterrupted$", "-test.v")
	cmd.Env = append(os.Environ(), "HOSTACCEL_BENCH_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var prefix string
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "BUILT" {
			prefix = f[1]
			for _, p := range f[2:] {
				n, _ := strconv.Atoi(p)
				pids = append(pids, n)
			}
			break
		}
	}
	if prefix == "" {
		t.Fatal("helper never built its cluster")
	}
	if len(testbed.Namespaces(t, prefix)) == 0 || len(pids) == 0 {
		t.Fatalf("helper's cluster not visible: namespaces %v, processes %v", testbed.Namespaces(t, prefix), pids)
	}
	time.Sleep(2 * time.Second) // netperf is running now
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("helper: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("helper did not exit within 60 s of SIGINT")
	}
	if ns := testbed.Namespaces(t, prefix); len(ns) > 0 {
		t.Errorf("namespaces left after SIGINT: %v", ns)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("netserver %d still there after SIGINT", pid)
		}
	}
	checkClean(t, prefix, before)
}

// TestHelperInterrupted is the process TestInterruptTearsDown interrupts: a bench run with
// long netperf runs, under the same signal handling as the command.
func TestHelperInterrupted(t *testing.T) {
	if os.Getenv("HOSTACCEL_BENCH_HELPER") != "1" {
		t.Skip("helper process")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	testHookBuilt = func(b *Bed) {
		fmt.Printf("BUILT %s %s\n", testbed.NamePrefix(), strings.Trim(fmt.Sprint(b.PIDs()), "[]"))
	}
	o := Defaults()
	o.Variants, o.Tests, o.Traffic = []string{VariantDefault}, []string{TCPStream}, []Traffic{PodToPod}
	o.Duration, o.Reps, o.Pktgen, o.Nodes = 60*time.Second, 1, false, 2
	_, err := RunHere(ctx, o, "host", nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("RunHere: %v, want context.Canceled", err)
	}
}

func TestCleanStale(t *testing.T) {
	testbed.RequireRoot(t)
	old := RecordDir
	RecordDir = t.TempDir()
	defer func() { RecordDir = old }()
	n, err := testbed.NewNS("stale")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// A process that has exited: its pid is free.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(RecordDir, fmt.Sprintf("%d.x", dead.Process.Pid))
	if err := os.WriteFile(rec, []byte(n.Name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	CleanStale()
	if _, err := os.Stat(filepath.Join("/run/netns", n.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale namespace %s not deleted", n.Name)
	}
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Error("stale record not removed")
	}
}
