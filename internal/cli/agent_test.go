package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// agentChild runs the agent in a child process of this test binary when the test that
// started it set HOSTACCEL_CLI_CHILD to its arguments (one per line), in the directory given
// by HOSTACCEL_CLI_CHILD_DIR.
func init() {
	if args := os.Getenv("HOSTACCEL_CLI_CHILD"); args != "" {
		if dir := os.Getenv("HOSTACCEL_CLI_CHILD_DIR"); dir != "" {
			os.Chdir(dir)
		}
		os.Exit(Main(strings.Split(args, "\n")))
	}
}

func startAgentChild(t *testing.T, dir string, args ...string) (*exec.Cmd, *strings.Builder, chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOSTACCEL_CLI_CHILD="+strings.Join(args, "\n"), "HOSTACCEL_CLI_CHILD_DIR="+dir)
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		done <- cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	return cmd, stderr, done
}

// A reload (SIGHUP) asked while the agent starts (here: the wait for an API server that does
// not answer, in Kubernetes mode) does not end it. Before, SIGHUP was caught only while Run ran,
// and Go's default for it ended the process.
func TestSIGHUPWhileTheAgentStarts(t *testing.T) {
	dir := t.TempDir()
	unreachableAPIServer(dir)
	cmd, stderr, done := startAgentChild(t, dir, "agent", "-f", "c.yaml", "--kubernetes", "--kubeconfig", "kc", "--node-name", "n1",
		"--lock-file", "l.lock", "--state-file", "st.json")
	time.Sleep(2 * time.Second) // the agent waits for the API server
	cmd.Process.Signal(syscall.SIGHUP)
	select {
	case err := <-done:
		t.Errorf("SIGHUP (reload) while the agent started ended it: %v\n%s", err, stderr)
	case <-time.After(2 * time.Second):
	}
}

// The agent records its lock and config as absolute paths, so that `hostaccel status` run
// from another directory finds it running. Before, a relative --lock-file was recorded as
// given, and status elsewhere said no agent ran.
func TestAgentRecordsAbsolutePaths(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("datapath: none\n"), 0o644)
	startAgentChild(t, dir, "agent", "-f", "c.yaml", "--lock-file", "l.lock", "--state-file", "st.json")
	var st agent.State
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "st.json"))
		if err == nil && json.Unmarshal(b, &st) == nil && st.PID != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no state after 10 s: %v", err)
		}
	}
	if st.LockFile != filepath.Join(dir, "l.lock") || st.ConfigPath != filepath.Join(dir, "c.yaml") {
		t.Errorf("state records lock %q and config %q, want them absolute in %s", st.LockFile, st.ConfigPath, dir)
	}
}

// A mistyped log level or format, or output format, is an error naming the flag (before: info,
// text and the default output, silently). The output formats are each command's own.
func TestBadLogFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"probe", "--log-level", "dbug"}, "--log-level"},
		{[]string{"probe", "--log-format", "jsn"}, "--log-format"},
		{[]string{"probe", "-o", "yml"}, `"yml" for "-o, --output" flag: not one of table, json`},
		{[]string{"status", "--output", "yaml"}, "not one of table, json"},
		{[]string{"lb", "show", "web", "-o", "xml"}, "not one of table, json, yaml"},
		{[]string{"lb", "list", "-o", "yaml"}, "not one of table, json"},
		{[]string{"k8s", "render", "-o", "table"}, "not one of yaml, summary, json"},
	} {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(c.args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("hostaccel %s: %v, want an error with %s", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// `lb add NAME -f FILE`: the file's service must be NAME (a file without a name gets it).
// Before, NAME was dropped without a word and the file's service added under its own name.
func TestLBAddNameAndFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "lb.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"name":"web"}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	add := func(file string) error {
		svc := filepath.Join(dir, "svc.yaml")
		os.WriteFile(svc, []byte(file), 0o644)
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetArgs([]string{"lb", "--socket", sock, "add", "web", "-f", svc})
		return root.Execute()
	}
	if err := add("name: other\nvips: [192.0.2.1]\nport: 80\n"); err == nil || !strings.Contains(err.Error(), `named other, not "web"`) {
		t.Errorf("lb add web -f (a service named other): %v, want an error naming both", err)
	}
	if len(got) != 0 {
		t.Errorf("sent %q for a file of another name", got)
	}
	if err := add("vips: [192.0.2.1]\nport: 80\n"); err != nil {
		t.Fatal(err)
	}
	if err := add("name: web\nvips: [192.0.2.1]\nport: 80\n"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !strings.Contains(got[0], `"name":"web"`) || !strings.Contains(got[1], "name: web") {
		t.Errorf("sent %q, want the nameless file with name web, then the named file as is", got)
	}
}

// In Kubernetes mode the metrics address serves while the agent waits for the API server:
// /livez answers 200 (a liveness probe does not restart the agent in a loop while the API
// server is away), /healthz 503. Before, nothing listened until the wait ended (found by a
// helper's review).
func TestLivezWhileWaitingForTheAPIServer(t *testing.T) {
	dir := t.TempDir()
	unreachableAPIServer(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	startAgentChild(t, dir, "agent", "-f", "c.yaml", "--kubernetes", "--kubeconfig", "kc", "--node-name", "n1",
		"--lock-file", "l.lock", "--state-file", "st.json", "--metrics-address", addr)
	get := func(path string) (int, error) {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err
		}
		r.Body.Close()
		return r.StatusCode, nil
	}
	var code int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, err = get("/livez"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || code != http.StatusOK {
		t.Fatalf("/livez while the agent waits for the API server: %d %v, want 200", code, err)
	}
	if code, err := get("/healthz"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("/healthz while the agent waits for the API server: %d %v, want 503", code, err)
	}
}

// unreachableAPIServer writes in dir a config (c.yaml, no datapath) and a kubeconfig (kc) of
// an API server that never answers.
func unreachableAPIServer(dir string) {
	os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("datapath: none\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "kc"), []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
}

// An agent container restarted (PID 1 again, /run/hostaccel a hostPath) while the API server is
// away: the new agent holds the lock and waits. `status` showed the previous agent's state
// file (healthy, 99 syncs) as the running agent's; it shows this one starting.
func TestStatusShowsANewAgentStarting(t *testing.T) {
	dir := t.TempDir()
	unreachableAPIServer(dir)
	lockPath, statePath := filepath.Join(dir, "l.lock"), filepath.Join(dir, "st.json")
	old, _ := json.Marshal(agent.State{PID: 1, LockFile: lockPath, Datapath: "none", Healthy: true, Syncs: 99, LastSync: time.Now().Add(-time.Hour)})
	if err := os.WriteFile(statePath, old, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, _, _ := startAgentChild(t, dir, "agent", "-f", "c.yaml", "--kubernetes", "--kubeconfig", "kc", "--node-name", "n1",
		"--lock-file", lockPath, "--state-file", statePath)
	ft, _ := flowtable.NewFakeManager()
	var st agent.Status
	testbed.WaitFor(t, "the new agent's state", 10*time.Second, 50*time.Millisecond, func() bool {
		st = agent.Gather(context.Background(), &datapath.Managers{Flowtable: ft}, statePath)
		return st.Agent != nil && st.Agent.PID == cmd.Process.Pid
	})
	if a := st.Agent; a.Syncs != 0 || a.Healthy || !strings.Contains(a.Starting, "Kubernetes API server") {
		t.Errorf("the new agent, waiting for the API server: %+v", a)
	}
	var out strings.Builder
	writeStatus(&out, st)
	if !strings.Contains(out.String(), fmt.Sprintf("agent: pid %d, starting: waiting for the Kubernetes API server", cmd.Process.Pid)) {
		t.Errorf("status:\n%s", out.String())
	}
}

// A --metrics-address that cannot be served ends the agent with an error naming the flag. It
// ran without /metrics, /healthz and /livez (the error only logged), and the deploy manifest's
// $(POD_IP):9464 was such an address on an IPv6 node.
func TestBadMetricsAddressRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("datapath: none\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"9464", "fd00::1:9464"} {
		_, stderr, done := startAgentChild(t, dir, "agent", "-f", "c.yaml", "--lock-file", filepath.Join(dir, "l.lock"),
			"--state-file", filepath.Join(dir, "st.json"), "--metrics-address", addr)
		select {
		case err := <-done:
			if err == nil || !strings.Contains(stderr.String(), "--metrics-address "+addr+":") {
				t.Errorf("--metrics-address %s: exit %v, stderr:\n%s", addr, err, stderr)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("--metrics-address %s: the agent runs", addr)
		}
	}
}
