package agent

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/lock"
)

// TestStateJSON: the published state is MarshalIndent's JSON, the source's report as it came.
func TestStateJSON(t *testing.T) {
	st := State{PID: 7, ConfigPath: "/etc/x.yaml", Datapath: "none", Healthy: true, Syncs: 3, LastSync: time.Unix(1e9, 0).UTC(),
		Degraded: []string{"a <b>"}, DriftRepairs: map[string]int{"lb": 1}}
	for _, src := range []json.RawMessage{nil, []byte(`{"nodeName":"self","summary":{"balanced":[{"name":"a/b"}]}}`), []byte(`"x"`)} {
		st.Source = src
		want, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got := stateJSON(st)
		if src == nil && !bytes.Equal(got, want) {
			t.Fatalf("without a source:\n%s\nwant\n%s", got, want)
		}
		var g, w bytes.Buffer
		if err := json.Compact(&g, got); err != nil {
			t.Fatalf("%v\n%s", err, got)
		}
		_ = json.Compact(&w, want)
		if g.String() != w.String() {
			t.Fatalf("got\n%s\nwant\n%s", got, want)
		}
		if !bytes.Contains(got, []byte("\n  \"syncs\": 3,\n")) {
			t.Fatalf("not indented:\n%s", got)
		}
	}
}

// status shows the agent of a state file only while it runs: its PID alive and the lock it
// recorded held. An agent in a container is PID 1 there, and the node's /proc/1 is init
// long after the Pod is gone.
func TestStateRunningNeedsTheLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hostaccel.lock")
	st := State{PID: 1, LockFile: path}
	if st.running() {
		t.Error("PID 1 without the lock held: running")
	}
	l, err := lock.Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if !st.running() {
		t.Error("PID 1 and the lock held: not running")
	}
	if (&State{PID: 1}).running() != true {
		t.Error("a state without a lock file (an older agent): the PID decides")
	}
}
