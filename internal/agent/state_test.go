package agent

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
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
