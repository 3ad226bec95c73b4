package cli

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// `lb backend add SERVICE ADDR:PORT,state=drain,priority=1` (the syntax of --backend) sends the
// options after the address: they were overwritten with the flags' defaults.
func TestBackendAddKeepsTheArgumentsOptions(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "lb.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"name":"web"}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetArgs([]string{"lb", "--socket", sock, "backend", "add", "web", "10.0.1.13:8080,weight=3,priority=1,state=drain"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	t.Logf("sent %s", got)
	if !strings.Contains(got, `"drain"`) || !strings.Contains(got, `"priority":1`) {
		t.Errorf("state=drain / priority=1 dropped: sent %s", got)
	}
}
