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
