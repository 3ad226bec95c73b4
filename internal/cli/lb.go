package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
)

func init() { commands = append(commands, lbCmd) }

// registerLBMetrics adds the agent's load balancer metrics to reg (for `agent --metrics-address`).
func registerLBMetrics(reg prometheus.Registerer, a *agent.Agent) {
	reg.MustRegister(lb.NewCollector(func(ctx context.Context) lb.Status { return a.LB().Status(ctx, true) }))
}

// fetchLBStatus asks a running agent's API for the load balancer's status (for `hostaccel
// status`), on socket (the one the agent's state names, else the default); nil when no agent
// serves the API there.
func fetchLBStatus(ctx context.Context, socket string) *lb.Status {
	if socket == "" {
		socket = lb.DefaultSocket
	}
	if _, err := os.Stat(socket); err != nil {
		return nil
	}
	var st lb.Status
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if lb.NewClient(socket, "", "").Do(ctx, http.MethodGet, "/v1/status", nil, &st) != nil {
		return nil
	}
	return &st
}

type lbFlags struct {
	socket, address, keyFile string
	output                   string
}

func (f *lbFlags) client() (*lb.Client, error) {
	key := ""
	if f.address != "" {
		if f.keyFile == "" {
			return nil, fmt.Errorf("--address needs --key-file")
		}
		b, err := config.ReadFile(f.keyFile)
		if err != nil {
			return nil, err
		}
		key = strings.TrimSpace(string(b))
	}
	return lb.NewClient(f.socket, f.address, key), nil
}

func lbCmd(g *globals) *cobra.Command {
	f := &lbFlags{}
	c := &cobra.Command{
		Use:   "lb",
		Short: "Manage the load balancer's services and backends through the agent's API",
		Long: "The agent's load balancer (docs/lb.md). Changes are validated, saved in the agent's state file\n" +
			"(they survive restarts) and applied before the command returns; an invalid change changes nothing.",
	}
	c.PersistentFlags().StringVar(&f.socket, "socket", lb.DefaultSocket, "the agent's API socket")
	c.PersistentFlags().StringVar(&f.address, "address", "", "the agent's API on TCP (host:port), instead of the socket")
	c.PersistentFlags().StringVar(&f.keyFile, "key-file", "", "the API key (with --address)")
	c.AddCommand(lbListCmd(f), lbShowCmd(f), lbStatusCmd(f), lbAddCmd(f), lbSetCmd(f), lbDeleteCmd(f), lbResetCmd(f),
		lbBackendCmd(f), lbRenderCmd())
	return c
}

func call(c *cobra.Command, f *lbFlags, method, path string, body, out any) error {
	cl, err := f.client()
	if err != nil {
		return err
	}
	return cl.Do(c.Context(), method, path, body, out)
}

// callAndSay sends a request without a body and, when it succeeds, prints done.
func callAndSay(c *cobra.Command, f *lbFlags, method, path, done string) error {
	if err := call(c, f, method, path, nil, nil); err != nil {
		return err
	}
	fmt.Fprintln(c.OutOrStdout(), done)
	return nil
}

// viewCmd completes c, a command that reads: it GETs path(args) and prints the answer as
// JSON with -o json, else with write.
func viewCmd[T any](c *cobra.Command, f *lbFlags, path func(args []string) string, write func(w io.Writer, v T) error, formats string, allowed ...string) *cobra.Command {
	c.RunE = func(c *cobra.Command, args []string) error {
		var v T
		if err := call(c, f, http.MethodGet, path(args), nil, &v); err != nil {
			return err
		}
		if f.output == "json" {
			return writeJSON(c.OutOrStdout(), v)
		}
		return write(c.OutOrStdout(), v)
	}
	outputFlag(c, &f.output, formats, allowed...)
	return c
}

func lbListCmd(f *lbFlags) *cobra.Command {
	c := &cobra.Command{Use: "list", Short: "List the services", Args: cobra.NoArgs}
	return viewCmd(c, f, func([]string) string { return "/v1/services" }, func(w io.Writer, svcs []lb.ServiceStatus) error {
		tw := newTab(w)
		fmt.Fprintln(tw, "NAME\tORIGIN\tVIPS\tPROTO\tPORTS\tTOPOLOGY\tSCHEDULER\tBACKENDS (ACTIVE/ALL)\tPACKETS")
		for _, s := range svcs {
			active := 0
			for _, b := range s.Backends {
				if b.Active {
					active++
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\n", s.Name, s.Origin, strings.Join(s.VIPs, ","), s.Protocol,
				ints(s.Ports), s.Topology, s.Scheduler, active, len(s.Backends), s.Packets)
		}
		return tw.Flush()
	}, "table or json", "table", "json")
}

func newTab(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 2, 8, 2, ' ', 0) }

func ints(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func lbShowCmd(f *lbFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a service: its definition (-o yaml), or its backends' states",
		Args:  cobra.ExactArgs(1),
	}
	return viewCmd(c, f, func(args []string) string { return lb.ServicePath(args[0]) }, func(w io.Writer, s lb.ServiceStatus) error {
		if f.output == "yaml" {
			b, err := yaml.Marshal(s.Service)
			if err != nil {
				return err
			}
			_, err = w.Write(b)
			return err
		}
		lb.WriteService(w, s)
		return nil
	}, "table, json, or yaml (the definition, for add -f)", "table", "json", "yaml")
}

func lbStatusCmd(f *lbFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "status",
		Short: "Every service and backend: admin state, health, last check, transitions, packets",
		Args:  cobra.NoArgs,
	}
	return viewCmd(c, f, func([]string) string { return "/v1/status" }, func(w io.Writer, st lb.Status) error {
		lb.WriteStatus(w, st)
		return nil
	}, "table or json", "table", "json")
}

// svcFlags are a service's fields as flags; for set, only the flags given change.
type svcFlags struct {
	file                                               string
	vips, hashFields, snat, backends                   []string
	ports                                              []int
	port                                               int
	protocol, topology, scheduler, iface, backendIface string
	persistence, flowTimeout                           time.Duration
	check, checkPath                                   string
	checkInterval, checkTimeout                        time.Duration
	checkRise, checkFall, checkPort, checkStatus       int
	flowTableSize                                      int
	flushConntrack                                     bool
}

func (s *svcFlags) add(c *cobra.Command, create bool) {
	fl := c.Flags()
	fl.StringVarP(&s.file, "file", "f", "", "the service as YAML or JSON (as in the config's loadBalancer.services)")
	fl.StringSliceVar(&s.vips, "vip", nil, "virtual IPs (IPv4 and/or IPv6), repeatable")
	fl.IntVar(&s.port, "port", 0, "port")
	fl.IntSliceVar(&s.ports, "ports", nil, "several ports (backends then keep the client's port)")
	fl.StringVar(&s.protocol, "protocol", "", "tcp (default), udp, sctp")
	fl.StringVar(&s.topology, "topology", "", "dnat (default), snat, dsr, stateless-dnat")
	fl.StringVar(&s.scheduler, "scheduler", "", "rr (default), weight, hash, symhash")
	fl.StringSliceVar(&s.hashFields, "hash-fields", nil, "hash: src-ip, src-port, dst-ip, dst-port")
	fl.DurationVar(&s.persistence, "persistence", 0, "keep a client on its backend this long after its last connection")
	fl.DurationVar(&s.flowTimeout, "flow-timeout", 0, "dsr, stateless-dnat: idle flow timeout")
	fl.IntVar(&s.flowTableSize, "flow-table-size", 0, "dsr, stateless-dnat, persistence: most flows (clients) kept per family (default 65536)")
	fl.StringVar(&s.iface, "interface", "", "dsr, stateless-dnat: where clients' packets arrive")
	fl.StringVar(&s.backendIface, "backend-interface", "", "dsr, stateless-dnat: where the backends are")
	fl.StringSliceVar(&s.snat, "snat-address", nil, "snat: source address per family (default: masquerade)")
	fl.BoolVar(&s.flushConntrack, "flush-conntrack", false, "delete a backend's conntrack entries when it goes down")
	if create {
		fl.StringArrayVar(&s.backends, "backend", nil, "ADDR[:PORT][,weight=N][,priority=N][,state=S][,mac=M], repeatable")
	}
	fl.StringVar(&s.check, "check", "", "health check: tcp, http, https, udp, dns, command, none")
	fl.StringVar(&s.checkPath, "check-path", "", "http(s) check path")
	fl.IntVar(&s.checkPort, "check-port", 0, "health check port (default: the backend's)")
	fl.IntVar(&s.checkStatus, "check-status", 0, "http(s): expected status (default 200)")
	fl.DurationVar(&s.checkInterval, "check-interval", 0, "health check interval (default 5s)")
	fl.DurationVar(&s.checkTimeout, "check-timeout", 0, "health check timeout (default 2s)")
	fl.IntVar(&s.checkRise, "check-rise", 0, "successes to go up (default 2)")
	fl.IntVar(&s.checkFall, "check-fall", 0, "failures to go down (default 3)")
}

// patch returns the fields whose flags were given, as a JSON merge patch.
func (s *svcFlags) patch(c *cobra.Command) (map[string]any, error) {
	p := map[string]any{}
	ch := c.Flags().Changed
	set := func(flag, field string, v any) {
		if ch(flag) {
			p[field] = v
		}
	}
	set("vip", "vips", s.vips)
	set("port", "port", s.port)
	set("ports", "ports", s.ports)
	set("protocol", "protocol", s.protocol)
	set("topology", "topology", s.topology)
	set("scheduler", "scheduler", s.scheduler)
	set("hash-fields", "hashFields", s.hashFields)
	set("interface", "interface", s.iface)
	set("backend-interface", "backendInterface", s.backendIface)
	set("snat-address", "snatAddresses", s.snat)
	set("flush-conntrack", "flushConntrack", s.flushConntrack)
	set("flow-table-size", "flowTableSize", s.flowTableSize)
	if ch("persistence") {
		p["persistence"] = dur(s.persistence)
	}
	if ch("flow-timeout") {
		p["flowTimeout"] = dur(s.flowTimeout)
	}
	hc := map[string]any{}
	for flag, kv := range map[string][2]any{
		"check": {"type", s.check}, "check-path": {"path", s.checkPath}, "check-port": {"port", s.checkPort},
		"check-status": {"expectStatus", s.checkStatus}, "check-rise": {"rise", s.checkRise}, "check-fall": {"fall", s.checkFall},
		"check-interval": {"interval", s.checkInterval.String()}, "check-timeout": {"timeout", s.checkTimeout.String()},
	} {
		if ch(flag) {
			hc[kv[0].(string)] = kv[1]
		}
	}
	if len(hc) > 0 {
		p["healthCheck"] = hc
	}
	var bes []lb.Backend
	for _, spec := range s.backends {
		b, err := parseBackend(spec)
		if err != nil {
			return nil, err
		}
		bes = append(bes, b)
	}
	if bes != nil {
		p["backends"] = bes
	}
	return p, nil
}

// dur writes a duration for the API; 0 removes the field (merge patch null).
func dur(d time.Duration) any {
	if d == 0 {
		return nil
	}
	return d.String()
}

// parseBackend reads ADDR[:PORT][,weight=N][,priority=N][,state=S][,mac=M].
func parseBackend(spec string) (lb.Backend, error) {
	parts := strings.Split(spec, ",")
	var b lb.Backend
	if ap, err := netip.ParseAddrPort(parts[0]); err == nil {
		b.Address, b.Port = ap.Addr().String(), int(ap.Port())
	} else {
		b.Address = strings.Trim(parts[0], "[]")
	}
	for _, kv := range parts[1:] {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "weight":
			var w int
			w, err = strconv.Atoi(v)
			b.Weight = &w
		case "priority":
			b.Priority, err = strconv.Atoi(v)
		case "state":
			b.State = v
		case "mac":
			b.MAC = v
		default:
			err = fmt.Errorf("unknown option %q (weight, priority, state, mac)", k)
		}
		if err != nil {
			return b, fmt.Errorf("backend %q: %v", spec, err)
		}
	}
	return b, nil
}

// changeService sends a change of a service and prints the service as the agent applied it.
func changeService(c *cobra.Command, f *lbFlags, method, path string, body any, verb string) error {
	var s lb.ServiceStatus
	if err := call(c, f, method, path, body, &s); err != nil {
		return err
	}
	fmt.Fprintf(c.OutOrStdout(), "%s: %s\n", s.Name, verb)
	lb.WriteService(c.OutOrStdout(), s)
	return nil
}

// namedFileService is the service of file (its bytes b) for `lb add NAME -f FILE`: b as is
// when it names NAME, with NAME when it names none; another name is an error (before, NAME
// was dropped without a word and the file's service added under its own).
func namedFileService(b []byte, file, name string) (any, error) {
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	switch n, _ := m["name"].(string); {
	case n == "" && m["name"] == nil:
		m["name"] = name
		return m, nil
	case n != name:
		return nil, fmt.Errorf("the service in %s is named %v, not %q: give no NAME with -f, or the same", file, m["name"], name)
	}
	return b, nil
}

// body is what add and set send: the file given with -f as is, else the flags given as a
// merge patch (returned also as patch).
func (s *svcFlags) body(c *cobra.Command) (body any, patch map[string]any, err error) {
	if s.file != "" {
		b, err := config.ReadFile(s.file)
		return b, nil, err
	}
	p, err := s.patch(c)
	return p, p, err
}

func lbAddCmd(f *lbFlags) *cobra.Command {
	s := &svcFlags{}
	c := &cobra.Command{
		Use:   "add [NAME] [flags] | add -f SERVICE.yaml",
		Short: "Add a service",
		Example: "  hostaccel lb add web --vip 192.0.2.10 --port 80 --topology snat --scheduler weight \\\n" +
			"      --backend 10.0.1.11:8080,weight=1 --backend 10.0.1.12:8080,weight=2 --check http --check-path /healthz",
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if s.file == "" && len(args) != 1 {
				return fmt.Errorf("give the service's name, or -f FILE")
			}
			body, p, err := s.body(c)
			if err != nil {
				return err
			}
			if p != nil {
				p["name"] = args[0]
			} else if len(args) == 1 {
				// NAME and -f: the file's service is that one (a file without a name gets it)
				if body, err = namedFileService(body.([]byte), s.file, args[0]); err != nil {
					return err
				}
			}
			return changeService(c, f, http.MethodPost, "/v1/services", body, "added")
		},
	}
	s.add(c, true)
	return c
}

func lbSetCmd(f *lbFlags) *cobra.Command {
	s := &svcFlags{}
	c := &cobra.Command{
		Use:     "set NAME [flags] | set NAME -f SERVICE.yaml",
		Short:   "Change a service: the flags given (or replace it whole with -f)",
		Example: "  hostaccel lb set web --scheduler hash --hash-fields src-ip,src-port\n  hostaccel lb set web --persistence 0s",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			body, p, err := s.body(c)
			if err != nil {
				return err
			}
			method := http.MethodPut // the whole service, from the file
			if p != nil {
				if len(p) == 0 {
					return fmt.Errorf("nothing to change: give flags, or -f FILE")
				}
				method = http.MethodPatch
			}
			return changeService(c, f, method, lb.ServicePath(args[0]), body, "changed")
		},
	}
	s.add(c, true)
	return c
}

func lbDeleteCmd(f *lbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a service (one from the config file stays deleted until `lb reset`)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return callAndSay(c, f, http.MethodDelete, lb.ServicePath(args[0]), "service "+args[0]+" deleted")
		},
	}
}

func lbResetCmd(f *lbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "reset NAME",
		Short: "Forget the API's changes to a service: the config file's definition (or none) applies again",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return callAndSay(c, f, http.MethodPost, lb.ServicePath(args[0])+"/reset", "service "+args[0]+" reset to the config file")
		},
	}
}

func lbBackendCmd(f *lbFlags) *cobra.Command {
	c := &cobra.Command{Use: "backend", Short: "Add, change, drain or remove a service's backends"}
	var b lb.Backend
	var weight int
	addFlags := func(c *cobra.Command) {
		c.Flags().IntVar(&weight, "weight", 1, "weight (1-1000)")
		c.Flags().IntVar(&b.Priority, "priority", 0, "0: primary; higher: backup used when no lower number is up")
		c.Flags().StringVar(&b.State, "state", "", "up, drain, down")
		c.Flags().StringVar(&b.MAC, "mac", "", "dsr: the backend's MAC (default: from the neighbour table)")
	}
	add := &cobra.Command{
		Use:   "add SERVICE ADDR[:PORT]",
		Short: "Add a backend",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			nb, err := parseBackend(args[1])
			if err != nil {
				return err
			}
			// the flags given override the argument's options (ADDR:PORT,state=drain,...);
			// those not given leave them (they were overwritten with the flags' defaults)
			if c.Flags().Changed("priority") {
				nb.Priority = b.Priority
			}
			if c.Flags().Changed("state") {
				nb.State = b.State
			}
			if c.Flags().Changed("mac") {
				nb.MAC = b.MAC
			}
			if c.Flags().Changed("weight") {
				nb.Weight = &weight
			}
			return changeService(c, f, http.MethodPost, lb.ServicePath(args[0])+"/backends", nb, "backend "+args[1]+" added")
		},
	}
	addFlags(add)
	patch := func(c *cobra.Command, args []string, p map[string]any, what string) error {
		return changeService(c, f, http.MethodPatch, lb.BackendPath(args[0], backendKey(args[1])), p, "backend "+args[1]+" "+what)
	}
	set := &cobra.Command{
		Use:   "set SERVICE BACKEND",
		Short: "Change a backend's weight, priority, state or MAC (BACKEND: ADDR or ADDR:PORT as listed)",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			p := map[string]any{}
			for flag, v := range map[string]any{"weight": weight, "priority": b.Priority, "state": b.State, "mac": b.MAC} {
				if c.Flags().Changed(flag) {
					p[flag] = v
				}
			}
			if len(p) == 0 {
				return fmt.Errorf("nothing to change: --weight, --priority, --state or --mac")
			}
			return patch(c, args, p, "changed")
		},
	}
	addFlags(set)
	drain := &cobra.Command{
		Use:   "drain SERVICE BACKEND",
		Short: "No new connections to the backend; its established connections stay (undo: set --state up)",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			return patch(c, args, map[string]any{"state": lb.StateDrain}, "draining")
		},
	}
	remove := &cobra.Command{
		Use:     "remove SERVICE BACKEND",
		Aliases: []string{"delete"},
		Short:   "Remove a backend",
		Args:    cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			return callAndSay(c, f, http.MethodDelete, lb.BackendPath(args[0], backendKey(args[1])), "service "+args[0]+": backend "+args[1]+" removed")
		},
	}
	c.AddCommand(add, set, drain, remove)
	return c
}

// backendKey writes a backend as the API names it ("fd00::1" stays, "[fd00::1]:80" stays).
func backendKey(s string) string {
	if b, err := parseBackend(s); err == nil {
		return lb.BackendKey(b.Address, b.Port)
	}
	return s
}

func lbRenderCmd() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "render -f CONFIG",
		Short: "Print the load balancer's nft tables for a config (no root; backends taken as healthy, unknown MACs as zeros)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := config.Load(file)
			if err != nil {
				return err
			}
			svcs, err := lb.Effective(cfg.LoadBalancer)
			if err != nil {
				return err
			}
			out, err := lb.Render(lb.Resolve(svcs, nil, lb.OfflineEnv(svcs, lb.Env{}))).Dump()
			if err != nil {
				return err
			}
			fmt.Fprint(c.OutOrStdout(), out)
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (required)")
	_ = c.MarkFlagRequired("file")
	return c
}
