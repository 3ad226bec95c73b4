package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// The Grafana dashboard and the PrometheusRule alerts under deploy/grafana/ name only metrics
// the agent exports: every metric in their expressions is in the /metrics of a real agent
// with traffic through it. On a kernel without the flowtable (this project's host) the agent
// runs the tc datapath and the load balancer (with a health-checked backend up and one down);
// the flowtable's class counters are then checked in the VM, where the agent runs the
// flowtable alone (the tc program and the load balancer cost a minute more under TCG, and are
// checked on the host). A kernel with both runs everything at once.
func TestDashboardMetricsExist(t *testing.T) {
	exprs := dashboardExprs(t)
	used := map[string][]string{} // metric -> where
	for _, e := range exprs {
		names := metricNames(e.expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", e.where, e.expr)
		}
		for _, n := range names {
			used[n] = append(used[n], e.where)
		}
	}
	// What users of the dashboards expect to find there.
	for _, n := range []string{"hostaccel_healthy", "hostaccel_offloaded_flows", "hostaccel_class_packets_total",
		"hostaccel_sync_errors_total", "hostaccel_sync_duration_seconds_bucket", "hostaccel_lb_backend_health",
		"hostaccel_tc_redirected_packets_total", "hostaccel_drift_repairs_total"} {
		if _, ok := used[n]; !ok {
			t.Errorf("the dashboard and alerts do not use %s", n)
		}
	}

	// Which parts run here, and where the others are checked.
	flowtable := caps.Has(probe.Flowtable)
	vmFlowtableOnly := flowtable && os.Getenv("HOSTACCEL_IN_VM") == "1"
	notHere := map[string]string{} // metric prefix -> where it is checked instead
	datapath := "datapath: auto\nclasses: {pod-to-pod: true, pod-to-service: true}\n"
	switch {
	case vmFlowtableOnly:
		datapath = "datapath: flowtable\nclasses: {pod-to-pod: true, pod-to-service: true}\n"
		notHere["hostaccel_tc_"] = "on the host (tc)"
		notHere["hostaccel_lb_"] = "on the host (load balancer)"
	case !flowtable:
		needTC(t)
		// auto: tc serves pod-to-pod; pod-to-service would need the flowtable.
		datapath = "datapath: auto\nclasses: {pod-to-pod: true}\n"
		notHere["hostaccel_class_"] = "in the VM (flowtable)"
	default:
		needTC(t)
	}

	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	a := tp.V4
	backend, err := tp.Remote.ListenTCP(netip.AddrPortFrom(a.RemotePod, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80)
	cfg := nodeConfig(tp, datapath+"agent: {resyncPeriod: 2s, minSyncInterval: 100ms}\n")
	if !vmFlowtableOnly {
		cfg += fmt.Sprintf(`loadBalancer:
  api: {socket: %s}
  stateFile: %s
  services:
  - name: web
    vips: [%s]
    port: %d
    topology: dnat
    healthCheck: {type: tcp, interval: 1s, timeout: 2s, rise: 1, fall: 1}
    backends:
    - {address: %s, port: 8080}
    - {address: %s, port: 8081}
`, filepath.Join(t.TempDir(), "lb.sock"), filepath.Join(t.TempDir(), "lb-state.yaml"), vip.Addr(), vip.Port(), a.RemotePod, a.RemotePod)
	}
	const metricsAddr = "127.0.0.1:9469"
	startAgent(t, tp.Node, "-f", writeConfig(t, cfg), "--state-file", filepath.Join(t.TempDir(), "agent.json"), "--metrics-address", metricsAddr)
	var scrapeErr error
	scrape := func() string {
		code, body, err := tp.Node.HTTPGet(metricsAddr, "/metrics")
		if err == nil && code != 200 {
			err = fmt.Errorf("HTTP %d", code)
		}
		if scrapeErr = err; err != nil {
			return ""
		}
		return body
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last scrape: error %v", scrapeErr)
		}
	})
	// Traffic through the datapath (pod -> remote pod) and the load balancer (pod -> VIP), so
	// that every counter has moved.
	dsts := []netip.AddrPort{netip.AddrPortFrom(a.RemotePod, 8080)}
	if vmFlowtableOnly {
		testbed.WaitFor(t, "the first sync", 90*time.Second, 200*time.Millisecond, func() bool {
			m := scrape()
			return strings.Contains(m, "\nhostaccel_syncs_total ") && !strings.Contains(m, "\nhostaccel_syncs_total 0\n")
		})
	} else {
		dsts = append(dsts, vip)
		// and the first sync's end: the health metrics follow the checks now (5f9d9ff), which
		// may answer before the sync that started them has attached the datapath
		testbed.WaitFor(t, "a health check of each backend and the first sync", 90*time.Second, 200*time.Millisecond, func() bool {
			m := scrape()
			return strings.Contains(m, "\nhostaccel_syncs_total ") && !strings.Contains(m, "\nhostaccel_syncs_total 0\n") &&
				strings.Contains(m, `hostaccel_lb_backend_health{backend="`+a.RemotePod.String()+`:8080",service="web",state="up"} 1`) &&
				strings.Contains(m, `hostaccel_lb_backend_health{backend="`+a.RemotePod.String()+`:8081",service="web",state="down"} 1`)
		})
	}
	for _, dst := range dsts {
		c, err := tp.Pod.DialTCP("", dst.String())
		if err != nil {
			t.Fatalf("pod -> %s: %v", dst, err)
		}
		if err := testbed.Transfer(c, 64<<10, 16<<10); err != nil {
			t.Errorf("pod -> %s: %v", dst, err)
		}
		c.Close()
	}
	exported := exportedMetrics(scrape())
	if len(exported) == 0 {
		t.Fatal("no metrics from the agent")
	}
	checked := 0
	for _, n := range slices.Sorted(maps.Keys(used)) {
		if _, ok := exported[n]; ok {
			checked++
			continue
		}
		where := ""
		for prefix, w := range notHere {
			if strings.HasPrefix(n, prefix) {
				where = w
			}
		}
		if where != "" {
			t.Logf("%s: not exported by this run; checked %s", n, where)
			continue
		}
		t.Errorf("%s (used by %s) is not in the agent's /metrics", n, strings.Join(used[n], "; "))
	}
	t.Logf("%d of the %d metrics named by %d expressions found in the agent's /metrics", checked, len(used), len(exprs))
}

type namedExpr struct{ where, expr string }

func deployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// dashboardExprs returns every PromQL expression of deploy/grafana/: the dashboard's panel
// targets and template variables, and the PrometheusRule's rules.
func dashboardExprs(t *testing.T) []namedExpr {
	t.Helper()
	var out []namedExpr
	b, err := os.ReadFile(filepath.Join(deployDir(), "grafana", "hostaccel.json"))
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Type    string   `json:"type"`
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("hostaccel.json: %v", err)
	}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("hostaccel.json: panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("hostaccel.json: panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, namedExpr{fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s*,\s*[a-zA-Z_]\w*\s*\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("hostaccel.json: variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("hostaccel.json: variable %s: %q is not label_values(metric, label)", v.Name, q.Query)
		}
		out = append(out, namedExpr{"variable " + v.Name, m[1]})
	}

	b, err = os.ReadFile(filepath.Join(deployDir(), "grafana", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert  string            `json:"alert"`
					Record string            `json:"record"`
					Expr   string            `json:"expr"`
					For    string            `json:"for"`
					Labels map[string]string `json:"labels"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &rule); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Errorf("alerts.yaml: kind %q", rule.Kind)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" {
				t.Errorf("alerts.yaml: group %s: a rule without alert, expr or severity: %+v", g.Name, r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alerts.yaml: %s: for: %v", r.Alert, err)
				}
			}
			out = append(out, namedExpr{"alert " + r.Alert, r.Expr})
			alerts++
		}
	}
	if alerts == 0 {
		t.Error("alerts.yaml has no alert")
	}
	return out
}

var (
	promStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promBraces  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promClauses = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promTokens  = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promWords   = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "atan2"}
)

// metricNames returns the metric names a PromQL expression selects: identifiers that are not
// functions (followed by "("), keywords, label names (in {}, by (...) and the like), strings,
// durations or numbers. Grafana's $variables only appear in matchers and ranges.
func metricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, `""`)
	s = promBraces.ReplaceAllString(s, " ")
	s = promClauses.ReplaceAllString(s, " ")
	var out []string
	for _, tok := range promTokens.FindAllString(s, -1) {
		if tok[0] >= '0' && tok[0] <= '9' || strings.HasSuffix(tok, "(") {
			continue
		}
		tok = strings.TrimSpace(tok)
		if slices.Contains(promWords, strings.ToLower(tok)) || slices.Contains(out, tok) {
			continue
		}
		out = append(out, tok)
	}
	sort.Strings(out)
	return out
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`hostaccel_healthy == 0`: "hostaccel_healthy",
		`histogram_quantile(0.99, sum by (le, instance) (rate(hostaccel_sync_duration_seconds_bucket{job=~"$job", instance=~"$instance"}[$__rate_interval]))) > 2`: "hostaccel_sync_duration_seconds_bucket",
		`sum by (job, instance, service) (hostaccel_lb_backend_active) == 0 and sum by (job, instance, service) (hostaccel_lb_backend_health) > 0`:                 "hostaccel_lb_backend_active hostaccel_lb_backend_health",
		`a / on(instance) group_left(x) b offset 5m > bool 1e3`:                                         "a b",
		`time() - max by (service, backend) (hostaccel_lb_backend_last_check_timestamp_seconds{s="x"})`: "hostaccel_lb_backend_last_check_timestamp_seconds",
		`hostaccel_lb_backend_health{state="down"}`:                                                     "hostaccel_lb_backend_health",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// exportedMetrics returns the sample names in a Prometheus text exposition: each family's
// name, and for histograms and summaries the _bucket, _sum and _count series.
func exportedMetrics(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		out[name] = true
	}
	return out
}
