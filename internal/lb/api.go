package lb

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hostaccel/hostaccel/internal/model"
)

// The local API (docs/lb.md): JSON over HTTP on a unix socket (mode 0600), and optionally on
// TCP where every request must carry "Authorization: Bearer <key>".
//
//	GET    /v1/status                                  Status (with counters)
//	GET    /v1/services                                []ServiceStatus
//	POST   /v1/services                                create (body: Service)
//	GET    /v1/services/{name}                         ServiceStatus
//	PUT    /v1/services/{name}                         create or replace
//	PATCH  /v1/services/{name}                         JSON merge patch (RFC 7386)
//	DELETE /v1/services/{name}
//	POST   /v1/services/{name}/reset                   drop the API's changes to a config service
//	POST   /v1/services/{name}/backends                add (body: Backend)
//	PATCH  /v1/services/{name}/backends/{backend}      merge patch ({"state": "drain"})
//	DELETE /v1/services/{name}/backends/{backend}
//	GET    /metrics                                    the load balancer's Prometheus metrics
//
// A change is validated with every other service, written to the state file and applied
// before the call returns; an invalid change is rejected (400, every error naming its
// field) and changes nothing.

// maxBody is the largest request body the API reads: a service with thousands of backends
// is well below it.
const maxBody = 1 << 20

// applyTimeout bounds how long a change waits for the agent to apply it.
var applyTimeout = 15 * time.Second

// writeTimeout bounds a request's handling: a change waits at most applyTimeout for the one
// before it and applyTimeout for its sync.
func writeTimeout() time.Duration { return 2*applyTimeout + 15*time.Second }

// clientTimeout is how long a client waits for an answer: longer than the server may take
// (writeTimeout, and a change that waits for the one before it to settle), so that a client
// does not give up on a change the agent then applies (before: 30 s, below the server's 45 s).
func clientTimeout() time.Duration { return writeTimeout() + applyTimeout }

type apiServer struct {
	mu      sync.Mutex
	servers []*http.Server
	socket  string
	tcpErr  error // why the TCP listener (api.listen) is not serving; the socket serves still
	closed  bool
	// key is what the TCP listener's clients must present (nil: none is valid), read again
	// from api.keyFile at every sync: a rotated key takes effect without a restart.
	key atomic.Pointer[[]byte]
}

// serveAPI starts, restarts or stops the API to match a (nil: off). A TCP listener that
// could not start (a key file unreadable, the address in use) leaves the unix socket serving,
// and is tried again at the next sync.
func (r *Runtime) serveAPI(a *API) error {
	r.mu.Lock()
	cur, running, closed := r.apiCfg, r.api, r.closed
	r.mu.Unlock()
	if closed {
		return nil
	}
	if a != nil && running != nil && *a == cur {
		running.mu.Lock()
		failed := running.tcpErr != nil
		running.mu.Unlock()
		if failed {
			return running.startTCP(*a, r.Handler())
		}
		if a.Listen != "" {
			return running.reloadKey(*a)
		}
		return nil
	}
	if running != nil {
		running.close(false) // from a sync: at once (see stop)
	}
	r.mu.Lock()
	r.api, r.apiCfg = nil, API{}
	r.mu.Unlock()
	if a == nil {
		return nil
	}
	srv, err := r.startAPI(*a)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed { // Stop ran meanwhile
		r.mu.Unlock()
		srv.close(false)
		return nil
	}
	r.api, r.apiCfg = srv, *a
	r.mu.Unlock()
	r.Log.Info("load balancer API serving", "socket", a.Socket, "listen", a.Listen)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.tcpErr
}

func (r *Runtime) startAPI(a API) (*apiServer, error) {
	s := &apiServer{socket: a.Socket}
	mux := r.Handler()
	if err := os.MkdirAll(filepath.Dir(a.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("loadBalancer.api.socket: %w", err)
	}
	// A stale socket from a previous run is removed; anything else there is not ours.
	if fi, err := os.Lstat(a.Socket); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("loadBalancer.api.socket: %s exists and is not a socket", a.Socket)
		}
		if c, err := net.DialTimeout("unix", a.Socket, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("loadBalancer.api.socket: %s: another process serves on it", a.Socket)
		}
		os.Remove(a.Socket)
	}
	ln, err := net.Listen("unix", a.Socket)
	if err != nil {
		return nil, fmt.Errorf("loadBalancer.api.socket: %w", err)
	}
	if err := os.Chmod(a.Socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("loadBalancer.api.socket: %w", err)
	}
	s.serve(ln, mux)
	_ = s.startTCP(a, mux) // (in s.tcpErr)
	return s, nil
}

// startTCP starts the TCP listener of a, if it has one; its error is kept in s.tcpErr.
func (s *apiServer) startTCP(a API, mux http.Handler) error {
	err := s.listenTCP(a, mux)
	s.mu.Lock()
	s.tcpErr = err
	s.mu.Unlock()
	return err
}

func (s *apiServer) listenTCP(a API, mux http.Handler) error {
	if a.Listen == "" {
		return nil
	}
	if err := s.reloadKey(a); err != nil {
		return err
	}
	tln, err := net.Listen("tcp", a.Listen)
	if err != nil {
		return fmt.Errorf("loadBalancer.api.listen: %w (the unix socket serves)", err)
	}
	s.serve(tln, requireKey(&s.key, mux))
	return nil
}

// reloadKey reads a's key file into s.key. A key that cannot be read, or is too short, makes
// the TCP listener refuse every request until it can (a key file removed or emptied revokes
// the key it held; the unix socket serves still).
func (s *apiServer) reloadKey(a API) error {
	key, err := model.ReadConfigFile(a.KeyFile)
	if err != nil {
		s.key.Store(nil)
		return fmt.Errorf("loadBalancer.api.keyFile: %w (the unix socket serves)", err)
	}
	k := bytes.TrimSpace(key)
	if len(k) < 16 {
		s.key.Store(nil)
		return fmt.Errorf("loadBalancer.api.keyFile: %s: the key is shorter than 16 bytes (the unix socket serves)", a.KeyFile)
	}
	s.key.Store(&k)
	return nil
}

func (s *apiServer) serve(ln net.Listener, h http.Handler) {
	// Idle and slow connections are closed: a peer that may reach api.listen (and not know
	// the key) must not hold the agent's file descriptors open for good. A change waits at
	// most applyTimeout for the one before it and applyTimeout for its sync (change): below
	// WriteTimeout.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: writeTimeout(), IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // (a TCP listener tried again while Stop closed the API)
		ln.Close()
		return
	}
	s.servers = append(s.servers, srv)
	go srv.Serve(ln)
}

// close stops accepting and closes the connections: gracefully, it lets the requests under
// way answer first (those waiting for a sync are woken by Stop), for up to apiCloseWait.
func (s *apiServer) close(graceful bool) {
	ctx, cancel := context.WithTimeout(context.Background(), apiCloseWait)
	defer cancel()
	s.mu.Lock()
	s.closed = true
	servers := s.servers
	s.mu.Unlock()
	for _, srv := range servers {
		if !graceful || srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	}
	os.Remove(s.socket)
}

// apiCloseWait bounds how long closing the API waits for the requests under way.
var apiCloseWait = 2 * time.Second

func requireKey(keyp *atomic.Pointer[[]byte], h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		key := keyp.Load()
		if !ok || key == nil || subtle.ConstantTimeCompare([]byte(got), *key) != 1 {
			writeErr(w, &apiError{http.StatusUnauthorized, []string{"missing or wrong key (Authorization: Bearer <key>)"}})
			return
		}
		h.ServeHTTP(w, req)
	})
}

// apiError is an error the API returns with its status.
type apiError struct {
	Status int      `json:"-"`
	Errors []string `json:"errors"`
}

func (e *apiError) Error() string { return strings.Join(e.Errors, "\n") }

func badRequest(errs ...error) *apiError {
	e := &apiError{Status: http.StatusBadRequest}
	for _, err := range errs {
		e.Errors = append(e.Errors, err.Error())
	}
	return e
}

// writeErr answers err: an apiError with its status; a change saved but not applied in time
// 504 (the kernel's apply, which the agent's loop runs, did not answer in time: it is applied
// later); a change saved while the agent stops 503 (applied when it starts again; no
// Retry-After: a retry would conflict); anything else (an apply the kernel refused, a state
// file not written) 500. An apiError of 503 is a change not saved: Retry-After.
func writeErr(w http.ResponseWriter, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.Status == http.StatusServiceUnavailable { // not saved: the caller may retry
			w.Header().Set("Retry-After", "1")
		}
	} else {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, errStopping): // saved: no Retry-After (a retried POST would conflict)
			status = http.StatusServiceUnavailable
		case errors.Is(err, context.DeadlineExceeded):
			status = http.StatusGatewayTimeout
		}
		ae = &apiError{status, []string{err.Error()}}
	}
	writeJSON(w, ae.Status, ae)
}

// unavailable is a change not saved because the agent is busy with the ones before it (503:
// the caller may retry).
func unavailable(format string, a ...any) *apiError {
	return &apiError{http.StatusServiceUnavailable, []string{fmt.Sprintf(format, a...)}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.Encode(v)
}

// Handler is the API's HTTP handler.
func (r *Runtime) Handler() http.Handler {
	mux := http.NewServeMux()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func(ctx context.Context) Status { return r.Status(ctx, true) }))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, req *http.Request) {
		writeJSON(w, http.StatusOK, r.Status(req.Context(), true))
	})
	mux.HandleFunc("GET /v1/services", func(w http.ResponseWriter, req *http.Request) {
		writeJSON(w, http.StatusOK, r.Status(req.Context(), true).Services)
	})
	mux.HandleFunc("GET /v1/services/{name}", func(w http.ResponseWriter, req *http.Request) {
		s, ok := r.ServiceStatus(req.Context(), req.PathValue("name"), true)
		if !ok {
			writeErr(w, notFound(req.PathValue("name")))
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
	change := func(fn func(req *http.Request, body []byte, svcs []Service, o *Overlay) (int, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				writeErr(w, &apiError{http.StatusRequestEntityTooLarge, []string{"the request body is larger than 1 MiB, the API's limit"}})
				return
			}
			if err != nil {
				writeErr(w, badRequest(err))
				return
			}
			var status int
			err = r.change(req.Context(), func(svcs []Service, o *Overlay) error {
				status, err = fn(req, body, svcs, o)
				return err
			})
			if err != nil {
				writeErr(w, err)
				return
			}
			name := req.PathValue("name")
			if name == "" {
				name = serviceName(body)
			}
			s, _ := r.ServiceStatus(req.Context(), name, false)
			writeJSON(w, status, s)
		}
	}
	mux.HandleFunc("POST /v1/services", change(func(_ *http.Request, body []byte, svcs []Service, o *Overlay) (int, error) {
		s, err := DecodeService(body)
		if err != nil {
			return 0, badRequest(err)
		}
		if find(svcs, s.Name) >= 0 {
			return 0, &apiError{http.StatusConflict, []string{fmt.Sprintf("service %s exists (use set to change it)", model.Quote(s.Name))}}
		}
		o.put(s)
		return http.StatusCreated, nil
	}))
	mux.HandleFunc("PUT /v1/services/{name}", change(func(req *http.Request, body []byte, svcs []Service, o *Overlay) (int, error) {
		s, err := DecodeService(body)
		if err != nil {
			return 0, badRequest(err)
		}
		if s.Name != req.PathValue("name") {
			return 0, badRequest(fmt.Errorf("name: %s differs from the path's %s", model.Quote(s.Name), model.Quote(req.PathValue("name"))))
		}
		o.put(s)
		if find(svcs, s.Name) < 0 {
			return http.StatusCreated, nil
		}
		return http.StatusOK, nil
	}))
	mux.HandleFunc("PATCH /v1/services/{name}", change(func(req *http.Request, body []byte, svcs []Service, o *Overlay) (int, error) {
		i := find(svcs, req.PathValue("name"))
		if i < 0 {
			return 0, notFound(req.PathValue("name"))
		}
		var s Service
		if err := mergePatch(svcs[i], body, &s, DecodeService); err != nil {
			return 0, err
		}
		if s.Name != svcs[i].Name {
			return 0, badRequest(errors.New("name: a service cannot be renamed (add a new one and delete this one)"))
		}
		o.put(s)
		return http.StatusOK, nil
	}))
	mux.HandleFunc("DELETE /v1/services/{name}", change(func(req *http.Request, _ []byte, svcs []Service, o *Overlay) (int, error) {
		name := req.PathValue("name")
		if find(svcs, name) < 0 {
			return 0, notFound(name)
		}
		o.remove(name, find(r.cfg.Services, name) >= 0) // change holds r.mu
		return http.StatusOK, nil
	}))
	mux.HandleFunc("POST /v1/services/{name}/reset", change(func(req *http.Request, _ []byte, svcs []Service, o *Overlay) (int, error) {
		name := req.PathValue("name")
		if find(svcs, name) < 0 && !slices.Contains(o.Deleted, name) { // neither in effect nor deleted through the API
			return 0, notFound(name)
		}
		o.reset(name)
		return http.StatusOK, nil
	}))
	mux.HandleFunc("POST /v1/services/{name}/backends", change(func(req *http.Request, body []byte, svcs []Service, o *Overlay) (int, error) {
		i := find(svcs, req.PathValue("name"))
		if i < 0 {
			return 0, notFound(req.PathValue("name"))
		}
		b, err := DecodeBackend(body)
		if err != nil {
			return 0, badRequest(err)
		}
		s := svcs[i]
		// (10.1.0.11 is 10.1.0.11:80 of a port-80 service)
		if j := s.sameBackend(b); j >= 0 {
			o := s.Backends[j]
			return 0, &apiError{http.StatusConflict, []string{fmt.Sprintf("service %s already has backend %s", model.Quote(s.Name), model.Cut(BackendKey(o.Address, o.Port)))}}
		}
		s.Backends = append(slices.Clone(s.Backends), b)
		o.put(s)
		return http.StatusCreated, nil
	}))
	backend := func(req *http.Request, svcs []Service) (Service, int, error) {
		i := find(svcs, req.PathValue("name"))
		if i < 0 {
			return Service{}, 0, notFound(req.PathValue("name"))
		}
		s := svcs[i]
		s.Backends = slices.Clone(s.Backends)
		j := findBackend(s, req.PathValue("backend"))
		if j < 0 {
			return s, 0, &apiError{http.StatusNotFound, []string{fmt.Sprintf("service %s has no backend %s", model.Quote(s.Name), model.Cut(req.PathValue("backend")))}}
		}
		return s, j, nil
	}
	mux.HandleFunc("PATCH /v1/services/{name}/backends/{backend}", change(func(req *http.Request, body []byte, svcs []Service, o *Overlay) (int, error) {
		s, j, err := backend(req, svcs)
		if err != nil {
			return 0, err
		}
		if err := mergePatch(s.Backends[j], body, &s.Backends[j], DecodeBackend); err != nil {
			return 0, err
		}
		o.put(s)
		return http.StatusOK, nil
	}))
	mux.HandleFunc("DELETE /v1/services/{name}/backends/{backend}", change(func(req *http.Request, _ []byte, svcs []Service, o *Overlay) (int, error) {
		s, j, err := backend(req, svcs)
		if err != nil {
			return 0, err
		}
		s.Backends = slices.Delete(s.Backends, j, j+1)
		o.put(s)
		return http.StatusOK, nil
	}))
	return mux
}

// serviceName is the name of the service in a request body ("" if it does not decode).
func serviceName(body []byte) string {
	s, _ := DecodeService(body)
	return s.Name
}

func notFound(name string) *apiError {
	return &apiError{http.StatusNotFound, []string{fmt.Sprintf("no service %s", model.Quote(name))}}
}

func find(svcs []Service, name string) int {
	return slices.IndexFunc(svcs, func(s Service) bool { return s.Name == name })
}

// findBackend finds a backend by its key ("10.0.0.1", "10.0.0.1:8080", "[fd00::1]:80").
func findBackend(s Service, key string) int {
	return slices.IndexFunc(s.Backends, func(b Backend) bool { return BackendKey(b.Address, b.Port) == key })
}

// mergePatch applies an RFC 7386 merge patch to cur and decodes the result strictly.
func mergePatch[T any](cur T, patch []byte, out *T, decode func([]byte) (T, error)) error {
	var p any
	if err := json.Unmarshal(patch, &p); err != nil {
		return badRequest(fmt.Errorf("patch: %v", err))
	}
	b, _ := json.Marshal(cur)
	var doc any
	json.Unmarshal(b, &doc)
	merged, _ := json.Marshal(merge(doc, p))
	v, err := decode(merged)
	if err != nil {
		return badRequest(err)
	}
	*out = v
	return nil
}

func merge(doc, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	d, ok := doc.(map[string]any)
	if !ok {
		d = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(d, k)
		} else {
			d[k] = merge(d[k], v)
		}
	}
	return d
}

// change applies fn (called with r.mu held) to a copy of the overlay, validates the result with every service,
// saves it, and waits for the agent to apply it. A failed apply restores the previous state.
//
// Changes run one at a time, so that a sync carries at most one change and a failed one rolls
// back exactly that change (two changes saved before one sync that failed were both told
// "rolled back", while the first stayed in force and the second, valid, was undone):
//   - a change waits for the one before it (lockChanges) as long as its caller waits, and at
//     most applyTimeout; one whose caller gave up meanwhile is not saved;
//   - once saved, it waits for its sync whether or not its caller still waits, so that a failed
//     one is rolled back all the same;
//   - one whose sync did not come within applyTimeout stays pending (r.unsettled): the next
//     change waits for that sync first, and rolls the pending one back if it failed.
func (r *Runtime) change(ctx context.Context, fn func(svcs []Service, o *Overlay) error) error {
	lockCtx, cancel := context.WithTimeout(ctx, applyTimeout)
	err := r.lockChanges(lockCtx)
	cancel()
	if err != nil {
		return unavailable("not saved: the change before it is still being applied: %v", err)
	}
	defer r.unlockChanges()
	if err := ctx.Err(); err != nil {
		return unavailable("not saved: %v", err)
	}
	if err := r.settlePending(ctx); err != nil {
		return unavailable("not saved: %v", err)
	}
	r.mu.Lock()
	if path := r.cfg.StatePath(); r.overlayPath != path {
		err := r.overlayErr
		r.mu.Unlock()
		return &apiError{http.StatusServiceUnavailable, []string{fmt.Sprintf("not saved: loadBalancer.stateFile %s is not loaded (%v): fix or remove it; the agent reads it again at its next sync", path, err)}}
	}
	prev := r.overlay.clone()
	o := r.overlay.clone()
	// The last valid merge, if known, is the current one: fn reads it, and the new merge is
	// validated where it differs from it (the services changed and those they could clash with).
	was, known := r.validated(r.cfg.Services)
	cur := was
	if !known {
		cur = Merge(r.cfg.Services, o)
	}
	if err := fn(cur, &o); err != nil {
		r.mu.Unlock()
		return err
	}
	svcs := Merge(r.cfg.Services, o)
	validate := ValidateServices
	if known {
		validate = func(svcs []Service, field func(int) string) []error { return ValidateChange(was, svcs, field) }
	}
	if errs := validate(svcs, fieldByName(svcs)); len(errs) > 0 {
		r.mu.Unlock()
		return badRequest(errs...)
	}
	if err := o.Save(r.overlayPath); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("loadBalancer.stateFile: %w", err)
	}
	r.overlay = o
	r.overlayVer++
	r.remember(r.cfg.Services, svcs)
	r.gen++
	gen := r.gen
	r.mu.Unlock()
	r.urgent.Store(true)
	r.Trigger()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
	defer cancel()
	err = r.waitApplied(wctx, gen)
	switch {
	case err == nil:
		return nil
	case !syncFailed(err):
		r.mu.Lock()
		r.pending = &pendingChange{gen: gen, prev: prev}
		r.mu.Unlock()
		return err
	}
	rolled, saveErr := r.rollback(gen, prev)
	switch {
	case !rolled:
		return err
	case saveErr != nil:
		return fmt.Errorf("%w (the change was rolled back, but the state file still has it: loadBalancer.stateFile: %v)", err, saveErr)
	}
	return fmt.Errorf("%w (the change was rolled back)", err)
}

// pendingChange is a change saved whose sync had not come when its caller was answered.
type pendingChange struct {
	gen  uint64
	prev Overlay // the overlay before it
}

// syncFailed reports whether waitApplied's err says that a sync carrying the change failed
// (not that the wait ended first, or that the agent stops).
func syncFailed(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, errStopping)
}

// settlePending waits for the sync of a change left pending (r.pending) and rolls it back if
// that sync failed; an error says it is still pending.
func (r *Runtime) settlePending(ctx context.Context) error {
	r.mu.Lock()
	p := r.pending
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	err := r.waitApplied(wctx, p.gen)
	if err != nil && !syncFailed(err) {
		return fmt.Errorf("an earlier change is not applied yet: %w", err)
	}
	if err != nil {
		rolled, saveErr := r.rollback(p.gen, p.prev)
		r.Log.Warn("an earlier API change whose sync failed was rolled back", "err", err, "rolledBack", rolled, "stateFileErr", saveErr)
	}
	r.mu.Lock()
	r.pending = nil
	r.mu.Unlock()
	return nil
}

// rollback restores prev as the overlay if no change came after generation gen.
func (r *Runtime) rollback(gen uint64, prev Overlay) (rolled bool, saveErr error) {
	r.mu.Lock()
	if rolled = r.gen == gen; rolled {
		r.overlay = prev
		r.overlayVer++
		saveErr = prev.Save(r.overlayPath)
		r.gen++
	}
	r.mu.Unlock()
	r.Trigger()
	return rolled, saveErr
}

// lockChanges takes the API's change lock, or gives up when ctx ends.
func (r *Runtime) lockChanges(ctx context.Context) error {
	r.mu.Lock()
	if r.changeSem == nil {
		r.changeSem = make(chan struct{}, 1)
	}
	sem := r.changeSem
	r.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Runtime) unlockChanges() {
	r.mu.Lock()
	sem := r.changeSem
	r.mu.Unlock()
	<-sem
}
