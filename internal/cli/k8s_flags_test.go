package cli

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/hostaccel/hostaccel/internal/k8s"
)

// --kubernetes-healthz-address: auto answers kube-proxy's node health check on its port only
// where hostaccel serves every Service (in place of kube-proxy: with labeled Services,
// kube-proxy still runs and holds the port); off and an address say it outright.
func TestKubeHealthzAddress(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
		err  string
	}{
		{nil, "", ""},
		{[]string{"--kubernetes-services=all"}, k8s.DefaultNodeHealthAddress, ""},
		{[]string{"--kubernetes-services=all", "--kubernetes-healthz-address=off"}, "", ""},
		{[]string{"--kubernetes-healthz-address=127.0.0.1:10999"}, "127.0.0.1:10999", ""},
		{[]string{"--kubernetes-healthz-address=10256"}, "", "--kubernetes-healthz-address"},
	} {
		cmd := &cobra.Command{Use: "x"}
		k := addKubeFlags(cmd, true)
		if err := cmd.ParseFlags(append([]string{"--node-name=self"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		o, err := k.options("", slog.Default())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err %v, want one naming %s", c.args, err, c.err)
			}
			continue
		}
		if err != nil || o.NodeHealthAddress != c.want {
			t.Errorf("%v: %q, %v; want %q", c.args, o.NodeHealthAddress, err, c.want)
		}
	}
}

// Status names the front that serves a front's internal clients: the short-circuit front of
// a Service whose traffic policies are both Local (every endpoint), where the cluster front
// has this node's only; and says whom the short-circuit front serves.
func TestStatusNamesTheShortCircuitFront(t *testing.T) {
	sum := &k8s.Summary{Balanced: []k8s.LBFront{
		{Namespace: "default", Service: "web", Port: "http", Front: k8s.FrontCluster, LBName: "c", VIPs: []string{"10.96.0.10"}, VIPPort: 80},
		{Namespace: "default", Service: "web", Port: "http", Front: k8s.FrontShortCircuit, LBName: "s", InternalOnly: true, VIPs: []string{"10.96.0.10"}, VIPPort: 80,
			Backends: []k8s.LBBackend{{Address: "10.244.1.5", Port: 8080, State: k8s.StateUp}}},
		{Namespace: "default", Service: "web", Port: "http", Front: k8s.FrontNodePort, LBName: "n", Internal: "s", VIPs: []string{"172.18.0.2"}, VIPPort: 30080},
	}}
	var b strings.Builder
	writeKubernetes(&b, k8s.Status{NodeName: "self", Connected: true, Summary: sum})
	for _, want := range []string{
		"(no endpoints: clients refused) (this node's Pods and the node: every endpoint, by the short-circuit front)",
		"10.244.1.5:8080 up (for this node's Pods and the node through the node port and external fronts only)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status:\n%s\nwant %q", b.String(), want)
		}
	}
}
