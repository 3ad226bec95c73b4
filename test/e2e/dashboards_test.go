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
// running the load balancer (with a health-checked backend) and the tc datapath, plus the
// flowtable where this kernel has it (the VM run of scripts/test.sh).
func TestDashboardMetricsExist(t *testing.T) {
	needTC(t)
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

	tp := testbed.NewTopoT(t, testbed.TopoOptions{})
	a := tp.V4
	backend, err := tp.Remote.ListenTCP(netip.AddrPortFrom(a.RemotePod, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	// auto: tc serves pod-to-pod; pod-to-service needs the flowtable (its class counters),
	// which only some kernels have.
	classes := "classes: {pod-to-pod: true}\n"
	if caps.Has(probe.Flowtable) {
		classes = "classes: {pod-to-pod: true, pod-to-service: true}\n"
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80)
	cfg := writeConfig(t, nodeConfig(tp, "datapath: auto\n"+classes+"agent: {resyncPeriod: 2s, minSyncInterval: 100ms}\n")+
		fmt.Sprintf(`loadBalancer:
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
`, filepath.Join(t.TempDir(), "lb.sock"), filepath.Join(t.TempDir(), "lb-state.yaml"), vip.Addr(), vip.Port(), a.RemotePod, a.RemotePod))
	const metricsAddr = "127.0.0.1:9469"
	startAgent(t, tp.Node, "-f", cfg, "--state-file", filepath.Join(t.TempDir(), "agent.json"), "--metrics-address", metricsAddr)
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
	// Traffic through tc (pod -> remote pod) and the load balancer (pod -> VIP), so that
	// every counter has moved; one backend is up and one down.
	testbed.WaitFor(t, "a health check of each backend", 90*time.Second, 200*time.Millisecond, func() bool {
		m := scrape()
		return strings.Contains(m, `hostaccel_lb_backend_health{backend="`+a.RemotePod.String()+`:8080",service="web",state="up"} 1`) &&
			strings.Contains(m, `hostaccel_lb_backend_health{backend="`+a.RemotePod.String()+`:8081",service="web",state="down"} 1`)
	})
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(a.RemotePod, 8080), vip} {
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

	// The flowtable's own series exist only where the kernel has it: scripts/test.sh checks
	// them in the VM.
	flowtableOnly := []string{"hostaccel_class_packets_total", "hostaccel_class_bytes_total"}
	for _, n := range slices.Sorted(maps.Keys(used)) {
		if _, ok := exported[n]; ok {
			continue
		}
		if slices.Contains(flowtableOnly, n) && !caps.Has(probe.Flowtable) {
			t.Logf("%s: not exported on this kernel (no flowtable); checked in the VM", n)
			continue
		}
		t.Errorf("%s (used by %s) is not in the agent's /metrics", n, strings.Join(used[n], "; "))
	}
	t.Logf("%d metrics named by %d expressions checked against the agent's /metrics", len(used), len(exprs))
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
