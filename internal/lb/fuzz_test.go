package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/golden"
)

// decodeNamesField matches what a decoding error says after its "service: " or "backend: "
// prefix: an unknown key, a type error naming the struct field, or a YAML syntax or
// structure error (a line, or for a null map key nothing at all: no field exists).
var decodeNamesField = regexp.MustCompile(`^[a-zA-Z]+(\[\d+\])?(\.[a-zA-Z]+(\[\d+\])?)*: |^unknown field "|Go struct field \S+|^yaml: |^  line \d+: |^unsupported map key |into Go value of type lb\.(Service|Backend)$`)

func checkDecodeError(t *testing.T, err error, prefix string, in []byte) {
	t.Helper()
	msg, ok := strings.CutPrefix(err.Error(), prefix)
	if !ok {
		t.Fatalf("decode error %q lacks the %q prefix\ninput: %q", err, prefix, in)
	}
	if !decodeErrorNamesField(msg) {
		t.Fatalf("decode error names no field: %q\ninput: %q", msg, in)
	}
}

func decodeErrorNamesField(msg string) bool {
	for _, line := range strings.Split(msg, "\n") {
		if !decodeNamesField.MatchString(line) {
			return false
		}
	}
	return true
}

// FuzzDecodeService: a service as the config file, the state file and the API's POST and PUT
// bodies give it. Decoding never panics and its errors name the field; validation's errors
// name the service's field; a valid service renders (knftables Fake), and writes back, as
// JSON and through the state file, to the same service.
func FuzzDecodeService(f *testing.F) {
	state := filepath.Join(f.TempDir(), "lb-services.yaml")
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeService(b)
		if err != nil {
			checkDecodeError(t, err, "service: ", b)
			return
		}
		if errs := ValidateServices([]Service{s}, func(int) string { return "services[0]" }); len(errs) > 0 {
			for _, err := range errs {
				if !strings.HasPrefix(err.Error(), "services[0].") {
					t.Fatalf("validation error names no field: %q\ninput: %q", err, b)
				}
			}
			return
		}
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeService(js)
		if err != nil {
			t.Fatalf("a valid service does not decode from its JSON: %v\ninput: %q\nJSON: %s", err, b, js)
		}
		sameService(t, "JSON", s, back, b)
		if err := (Overlay{Services: []Service{s}}).Save(state); err != nil {
			t.Fatal(err)
		}
		o, err := LoadOverlay(state)
		if err != nil || len(o.Services) != 1 {
			y, _ := os.ReadFile(state)
			t.Fatalf("a valid service does not load from the state file: %v\ninput: %q\nfile:\n%s", err, b, y)
		}
		sameService(t, "state file", s, o.Services[0], b)
		svcs := []Service{s}
		if _, err := Render(Resolve(svcs, nil, OfflineEnv(svcs, Env{}))).Dump(); err != nil {
			t.Fatalf("a valid service does not render: %v\ninput: %q", err, b)
		}
	})
}

// sameService compares services as their JSON (nil and empty lists are the same service).
func sameService(t *testing.T, via string, a, b Service, in []byte) {
	t.Helper()
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("%s round trip differs:\ninput: %q\nbefore: %s\nafter:  %s", via, in, ja, jb)
	}
}

// apiNamesField: an API error names what is wrong: the body's decoding error (a patch that
// is not JSON has no field), or a service's field (by name or index), or the name.
func apiNamesField(e string) bool {
	for _, p := range []string{"service: ", "backend: "} {
		if msg, ok := strings.CutPrefix(e, p); ok {
			return decodeErrorNamesField(msg)
		}
	}
	return strings.HasPrefix(e, "patch: ") || serviceField.MatchString(e)
}

var serviceField = regexp.MustCompile(`^services\[[^\]]*\]\.|^name: `)

// apiOps are the API's changes; the fuzzer picks one, the path's name and the body.
var apiOps = []struct{ method, path string }{
	{http.MethodPost, "/v1/services"},
	{http.MethodPut, "/v1/services/%s"},
	{http.MethodPatch, "/v1/services/%s"},
	{http.MethodPost, "/v1/services/%s/backends"},
	{http.MethodPatch, "/v1/services/web/backends/%s"},
	{http.MethodDelete, "/v1/services/%s"},
	{http.MethodPost, "/v1/services/%s/reset"},
	{http.MethodDelete, "/v1/services/web/backends/%s"},
}

// FuzzAPI sends one change to the local API of a runtime on the knftables Fake (config
// services web and dsr; the API's earlier changes forgotten before each call; health checks
// and neighbour solicitation stubbed: nothing leaves the process). It never answers 500 (a
// change validation accepted always applies); a 400's every error names its field.
func FuzzAPI(f *testing.F) {
	dsr := fixture(DSR, Hash)
	dsr.Name, dsr.VIPs = "dsr", []string{"192.0.2.11"}
	cfg := Config{API: &API{Disabled: true}, StateFile: filepath.Join(f.TempDir(), "lb-services.yaml"),
		Services: []Service{fixture(DNAT, RoundRobin), dsr}}
	r, _, _ := testRuntime(f, cfg)
	r.checker.check = func(ctx context.Context, _ target) error { <-ctx.Done(); return ctx.Err() }
	h := r.Handler()
	f.Fuzz(func(t *testing.T, op uint, name string, body []byte) {
		r.mu.Lock()
		r.overlay = Overlay{}
		r.mu.Unlock()
		o := apiOps[op%uint(len(apiOps))]
		path := o.path
		if strings.Contains(path, "%s") {
			path = fmt.Sprintf(path, url.PathEscape(name))
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(o.method, path, bytes.NewReader(body)))
		switch w.Code {
		case http.StatusOK, http.StatusCreated, http.StatusNotFound, http.StatusConflict:
		case http.StatusMethodNotAllowed, http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect: // the mux: an empty or odd name
		case http.StatusBadRequest:
			var ae apiError
			if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil || len(ae.Errors) == 0 {
				t.Fatalf("400 without errors: %s", w.Body)
			}
			for _, e := range ae.Errors {
				if !apiNamesField(e) {
					t.Fatalf("%s %s: error names no field: %q\nbody: %q", o.method, path, e, body)
				}
			}
		default:
			t.Fatalf("%s %s: %d %s\nbody: %q", o.method, path, w.Code, w.Body, body)
		}
	})
}

// TestFuzzSeeds keeps the seed corpora of FuzzDecodeService and FuzzAPI current (go test
// -update rewrites them): every topology and scheduler, the examples' services, and invalid
// services around them.
func TestFuzzSeeds(t *testing.T) {
	svc := map[string][]any{}
	add := func(name string, b []byte) { svc[name] = []any{b} }
	for _, topo := range topologies {
		for _, sched := range schedulers {
			s := fixture(topo, sched)
			y, err := yaml.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			add(topo+"-"+sched, y)
		}
	}
	for _, topo := range topologies {
		s := fixture(topo, RoundRobin)
		s.Persistence, s.FlushConntrack, s.Protocol = D(600e9), topo == SNAT || topo == DNAT, "udp"
		if topo == SNAT {
			s.SNATAddresses = []string{"203.0.113.1", "2001:db8::1"}
		}
		s.Backends[0].State, s.Backends[1].Priority = StateDrain, 1
		s.HealthCheck = &HealthCheck{Type: "udp", Send: "ping", Expect: "pong", Interval: Duration{Duration: 1e9}}
		js, _ := json.Marshal(s)
		add(topo+"-json", js)
	}
	files, _ := filepath.Glob("../../examples/lb-*.yaml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			LoadBalancer Config `json:"loadBalancer"`
		}
		if err := yaml.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		for _, s := range c.LoadBalancer.Services {
			y, _ := yaml.Marshal(s)
			add("example-"+s.Name, y)
		}
	}
	for name, y := range map[string]string{
		"multiport":       "{name: m, vips: [192.0.2.1], ports: [53, 5353], protocol: udp, scheduler: hash, hashFields: [dst-port], backends: [{address: 10.0.0.1}]}",
		"health-command":  "{name: c, vips: [192.0.2.1], port: 80, healthCheck: {type: command, command: [/bin/true]}, backends: [{address: 10.0.0.1, weight: 1000}]}",
		"health-http":     "{name: h, vips: [192.0.2.1], port: 80, healthCheck: {type: http, path: /, host: x, expectStatus: 204, expect: ok, timeout: 3s, rise: 1, fall: 100}, backends: [{address: 10.0.0.1, port: 8080}]}",
		"bad-unknown":     "name: bad\nbogus: 1\n",
		"bad-type":        "{name: bad, vips: 192.0.2.1, port: eighty}",
		"bad-port":        "{name: bad, vips: [192.0.2.1], port: 0, backends: [{address: 10.0.0.1}]}",
		"bad-vip":         "{name: Bad, vips: [fe80::1%eth0, 0.0.0.0, 192.0.2.1, 192.0.2.1], port: 70000, backends: []}",
		"bad-backend":     "{name: bad, vips: [192.0.2.1], port: 80, backends: [{address: 10.0.0.1, weight: 1001, priority: -1, state: paused, mac: x}, {address: x}]}",
		"bad-dsr-port":    "{name: bad, vips: [192.0.2.1], port: 80, topology: dsr, interface: eth0, backends: [{address: 10.0.0.1, port: 8080}]}",
		"bad-health":      "{name: bad, vips: [192.0.2.1], port: 80, healthCheck: {type: udp, interval: 1ms, timeout: 2h, query: x}, backends: [{address: 10.0.0.1}]}",
		"bad-persist":     "{name: bad, vips: [192.0.2.1], port: 80, persistence: 5, backends: [{address: 10.0.0.1}]}",
		"bad-flowtimeout": "{name: bad, vips: [192.0.2.1], port: 80, flowTimeout: 1m, backends: [{address: 10.0.0.1}]}",
		"bad-yaml":        "{name: [",
		"bad-list":        "- 1\n",
	} {
		add(name, []byte(y))
	}
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzDecodeService", svc)

	api := map[string][]any{}
	for name, e := range map[string]struct {
		op         uint
		name, body string
	}{
		"post":             {0, "", `{"name": "api", "vips": ["192.0.2.20"], "port": 80, "backends": [{"address": "10.1.0.11"}]}`},
		"post-yaml":        {0, "", "name: api\nvips: [192.0.2.20]\nport: 443\ntopology: snat\nbackends: [{address: 10.1.0.11, port: 8443}]\n"},
		"post-exists":      {0, "", `{"name": "web", "vips": ["192.0.2.20"], "port": 80, "backends": [{"address": "10.1.0.11"}]}`},
		"post-vip-clash":   {0, "", `{"name": "api", "vips": ["192.0.2.10"], "port": 80, "backends": [{"address": "10.1.0.11"}]}`},
		"post-bad":         {0, "", `{"name": "api", "bogus": 1}`},
		"post-dsr":         {0, "", `{"name": "d2", "vips": ["192.0.2.12"], "port": 80, "topology": "dsr", "interface": "eth1", "backends": [{"address": "10.1.0.99"}]}`},
		"put":              {1, "web", `{"name": "web", "vips": ["192.0.2.10"], "port": 80, "backends": [{"address": "10.1.0.12", "port": 8080}]}`},
		"put-rename":       {1, "web", `{"name": "other", "vips": ["192.0.2.10"], "port": 80, "backends": [{"address": "10.1.0.12"}]}`},
		"put-new":          {1, "new", `{"name": "new", "vips": ["192.0.2.30"], "ports": [80, 81], "protocol": "sctp", "backends": [{"address": "10.1.0.12"}]}`},
		"patch-sched":      {2, "web", `{"scheduler": "hash", "hashFields": ["src-ip", "dst-ip"]}`},
		"patch-null":       {2, "web", `{"backends": null}`},
		"patch-rename":     {2, "web", `{"name": "x"}`},
		"patch-not-object": {2, "dsr", `[1, 2]`},
		"patch-bad-json":   {2, "dsr", `{"flowTimeout": "1m"`},
		"patch-topology":   {2, "web", `{"topology": "stateless-dnat", "interface": "eth0", "backendInterface": "eth1", "vips": ["192.0.2.10"]}`},
		"patch-missing":    {2, "nope", `{}`},
		"add-backend":      {3, "web", `{"address": "10.1.0.20", "port": 8080, "weight": 5}`},
		"add-backend-dup":  {3, "web", `{"address": "10.1.0.11", "port": 8080}`},
		"add-backend-bad":  {3, "dsr", `{"address": "10.1.0.20", "port": 81, "mac": "zz"}`},
		"drain":            {4, "10.1.0.11:8080", `{"state": "drain"}`},
		"backend-null":     {4, "[fd00:b::11]:8080", `{"port": null, "weight": 1000}`},
		"backend-missing":  {4, "10.9.9.9", `{"state": "down"}`},
		"delete":           {5, "dsr", ``},
		"delete-missing":   {5, "x", ``},
		"reset":            {6, "web", ``},
		"delete-backend":   {7, "10.1.0.12:8080", ``},
		"odd-name":         {1, "a/b?c", `{"name": "a/b?c"}`},
	} {
		api[name] = []any{e.op, e.name, []byte(e.body)}
	}
	golden.FuzzSeeds(t, "testdata/fuzz/FuzzAPI", api)
}
