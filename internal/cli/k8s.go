package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/hostaccel/hostaccel/internal/k8s"
)

func init() { commands = append(commands, k8sCmd) }

// kubeFlags are the Kubernetes mode's flags, shared by `agent --kubernetes` and `k8s render`.
type kubeFlags struct {
	enabled     bool
	kubeconfig  string
	nodeName    string
	peers       string
	peerSubnets []string
	services    string
	proxyName   string
	healthCheck bool   // agent: answer the Services' healthCheckNodePorts
	nodeHealth  string // agent: where to answer kube-proxy's node health check

	src *k8s.Source // started by startSource
}

// addKubeFlags adds the Kubernetes flags to c; withSwitch adds --kubernetes itself (agent).
func addKubeFlags(c *cobra.Command, withSwitch bool) *kubeFlags {
	k := &kubeFlags{}
	f := c.Flags()
	if withSwitch {
		f.BoolVar(&k.enabled, "kubernetes", false, "take the node's CIDRs, peers and Services from the Kubernetes API; -f is then the base config they are added to (the ConfigMap)")
		f.BoolVar(&k.healthCheck, "kubernetes-health-checks", true, "answer the healthCheckNodePort of every balanced LoadBalancer Service with externalTrafficPolicy Local, as kube-proxy does (200 while this node has endpoints of it, else 503)")
		f.StringVar(&k.nodeHealth, "kubernetes-healthz-address", "auto", "answer kube-proxy's node health check (/healthz, /livez) on this address: auto ("+k8s.DefaultNodeHealthAddress+" with --kubernetes-services=all, in place of kube-proxy; none otherwise), off, or host:port")
	}
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the Pod's in-cluster config, else $KUBECONFIG)")
	f.StringVar(&k.nodeName, "node-name", "", "this node's Node object (default: $NODE_NAME from the downward API, else the host name)")
	f.StringVar(&k.peers, "kubernetes-peers", string(k8s.PeersAll), "which other Nodes' Pod CIDRs are accelerated: all, or same-subnet (Antrea hybrid: only peers reachable without encapsulation)")
	f.StringSliceVar(&k.peerSubnets, "kubernetes-peer-subnets", nil, "transport subnets for same-subnet (default: the prefixes of the local addresses that hold the node's InternalIPs)")
	f.StringVar(&k.services, "kubernetes-services", string(k8s.ServicesLabeled), "which Services the load balancer serves: none, labeled (service.kubernetes.io/service-proxy-name=NAME), or all (in place of kube-proxy)")
	f.StringVar(&k.proxyName, "kubernetes-proxy-name", k8s.DefaultProxyName, "the service-proxy-name hostaccel answers to")
	return k
}

// options turns the flags into source options.
func (k *kubeFlags) options(base string, log *slog.Logger) (k8s.Options, error) {
	node, err := k8s.NodeName(k.nodeName)
	if err != nil {
		return k8s.Options{}, err
	}
	o := k8s.Options{NodeName: node, BaseConfigPath: base, Peers: k8s.PeerPolicy(k.peers),
		Services: k8s.ServicePolicy(k.services), ProxyName: k.proxyName, Log: log, HealthChecks: k.healthCheck}
	switch k.nodeHealth {
	case "", "off":
	case "auto":
		if o.Services == k8s.ServicesAll {
			o.NodeHealthAddress = k8s.DefaultNodeHealthAddress
		}
	default:
		if _, _, err := net.SplitHostPort(k.nodeHealth); err != nil {
			return o, fmt.Errorf("--kubernetes-healthz-address: %q is not auto, off or host:port", k.nodeHealth)
		}
		o.NodeHealthAddress = k.nodeHealth
	}
	for _, s := range k.peerSubnets {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return o, fmt.Errorf("--kubernetes-peer-subnets: %q is not a CIDR", s)
		}
		o.PeerSubnets = append(o.PeerSubnets, p.Masked())
	}
	return o, nil
}

// startSource connects to the API, runs the source until ctx ends and waits (up to timeout;
// 0: until ctx ends) for its first config. The agent consumes it as its agent.Source.
func (k *kubeFlags) startSource(ctx context.Context, log *slog.Logger, base string, timeout time.Duration) (*k8s.Source, error) {
	// client-go logs through klog; send it where hostaccel logs.
	klog.SetSlogLogger(log.With("component", "client-go"))
	opts, err := k.options(base, log)
	if err != nil {
		return nil, err
	}
	client, rc, err := k8s.NewClient(k.kubeconfig)
	if err != nil {
		return nil, err
	}
	src, err := k8s.New(client, opts)
	if err != nil {
		return nil, err
	}
	src.Host(rc.Host)
	log.Info("kubernetes mode", "apiServer", rc.Host, "node", opts.NodeName, "peers", opts.Peers, "services", opts.Services)
	go src.Run(ctx)
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := src.WaitReady(wctx); err != nil {
		return nil, err
	}
	k.src = src
	return src, nil
}

// registerMetrics adds the source's metrics (hostaccel_kubernetes_*) to reg; nothing outside
// Kubernetes mode.
func (k *kubeFlags) registerMetrics(reg prometheus.Registerer) {
	if k.src != nil {
		reg.MustRegister(k.src)
	}
}

func k8sCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "k8s",
		Short: "Kubernetes mode: what the API says this node should do",
	}
	c.AddCommand(k8sRenderCmd(g))
	return c
}

func k8sRenderCmd(g *globals) *cobra.Command {
	var file, output string
	var timeout time.Duration
	var k *kubeFlags
	c := &cobra.Command{
		Use:   "render [-f BASE] [--kubeconfig FILE] [--node-name NODE]",
		Args:  cobra.NoArgs, // a stray word is refused: `--flag false` made it true
		Short: "Print the config the agent derives from the API for a node (read-only, no root)",
		Long: "Lists Nodes, Services and EndpointSlices once, adds what they say about the node to the\n" +
			"base config (the agent's ConfigMap) and prints the result: a config file that `hostaccel\n" +
			"render -f` and `apply -f` accept. -o summary explains it; -o json is the source's status.",
		RunE: func(c *cobra.Command, _ []string) error {
			log := g.logger()
			ctx, cancel := context.WithCancel(c.Context())
			defer cancel()
			src, err := k.startSource(ctx, log, file, timeout)
			if err != nil {
				return err
			}
			d := src.Derived()
			switch output {
			case "yaml":
				y, err := d.YAML()
				if err != nil {
					return err
				}
				_, err = c.OutOrStdout().Write(y)
				return err
			case "json":
				return writeJSON(c.OutOrStdout(), src.Status())
			case "summary":
				writeKubernetes(c.OutOrStdout(), src.Status())
				return nil
			}
			return fmt.Errorf("-o: %q is not one of yaml, summary, json", output) // (refused by the flag)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "base config (default: none; a fastpath datapath then lacks node.gateways)")
	outputFlag(c, &output, "yaml (the derived config), summary, or json", "yaml", "summary", "json")
	c.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the API")
	k = addKubeFlags(c, false)
	return c
}

// writeKubernetesStatus prints the Kubernetes section of `hostaccel status` from the agent's
// published State.Source (nothing when it is not a Kubernetes source's report).
func writeKubernetesStatus(out io.Writer, raw json.RawMessage) {
	var st k8s.Status
	if len(raw) == 0 || json.Unmarshal(raw, &st) != nil || st.NodeName == "" {
		return
	}
	fmt.Fprintln(out)
	writeKubernetes(out, st)
}

func writeKubernetes(out io.Writer, st k8s.Status) {
	conn := "connected"
	if !st.Connected {
		conn = "DISCONNECTED"
		if !st.DisconnectedSince.IsZero() {
			conn += fmt.Sprintf(" since %s (keeping the last applied state): %s", st.DisconnectedSince.Format(time.RFC3339), st.LastAPIError)
		}
	}
	fmt.Fprintf(out, "kubernetes: node %s, API %s %s, %d derivations, %d changes", st.NodeName, st.APIServer, conn, st.Derivations, st.Changes)
	if !st.LastChange.IsZero() {
		fmt.Fprintf(out, ", last %s", st.LastChange.Format("15:04:05"))
	}
	fmt.Fprintln(out)
	if st.DeriveError != "" {
		fmt.Fprintf(out, "  rejected (keeping the last good config): %s\n", st.DeriveError)
	}
	sum := st.Summary
	if sum == nil {
		return
	}
	fmt.Fprintf(out, "  local Pod CIDRs: %s; node IPs: %s\n", list(sum.LocalPodCIDRs), list(sum.NodeIPs))
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  PEER (%s)\tPOD CIDRS\tNODE IPS\tACCELERATED\n", sum.PeerPolicy)
	for _, p := range sum.Peers {
		acc := "yes"
		if !p.Accelerated {
			acc = "no: " + p.Reason
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, list(p.PodCIDRs), list(p.NodeIPs), acc)
	}
	tw.Flush()
	if len(sum.ExternalIPs) > 0 {
		fmt.Fprintf(out, "  LoadBalancer / external IPs: %s\n", list(sum.ExternalIPs))
	}
	if len(sum.Balanced) > 0 {
		tw = tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "  SERVICE\tFRONT\tVIPS\tPROTO\tTOPOLOGY\tPERSISTENCE\tBACKENDS")
		for _, f := range sum.Balanced {
			var bs []string
			for _, b := range f.Backends {
				bs = append(bs, hostPorts([]string{b.Address}, b.Port)+" "+b.State)
			}
			backends := strings.Join(bs, ", ")
			if len(bs) == 0 {
				backends = "(no endpoints: clients refused)"
			}
			if f.Skipped != "" {
				backends = "(" + f.Skipped + ")"
			}
			if f.Internal != "" {
				by := k8s.FrontCluster
				if i := slices.IndexFunc(sum.Balanced, func(o k8s.LBFront) bool { return o.LBName == f.Internal }); i >= 0 {
					by = sum.Balanced[i].Front
				}
				backends += " (this node's Pods and the node: every endpoint, by the " + by + " front)"
			}
			if f.InternalOnly {
				backends += " (for this node's Pods and the node through the node port and external fronts only)"
			}
			for _, why := range f.LeftOut {
				backends += " (left out: " + why + ")"
			}
			pers := "-"
			if f.Persistence > 0 {
				pers = f.Persistence.String()
			}
			fmt.Fprintf(tw, "  %s/%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Namespace, f.Service, f.Port, f.Front,
				hostPorts(f.VIPs, f.VIPPort), f.Protocol, f.Topology, pers, backends)
		}
		tw.Flush()
	}
	for _, w := range sum.Warnings {
		fmt.Fprintf(out, "  warning: %s\n", w)
	}
}

// hostPorts writes addresses with a port: 10.0.0.1:80, [fd00::1]:80.
func hostPorts(addrs []string, port int32) string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = net.JoinHostPort(a, strconv.Itoa(int(port)))
	}
	return list(out)
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
