package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hostaccel/hostaccel/internal/agent"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// Rule counters restart at zero when the table is rebuilt; the exported counter does not.
func TestClassCountersStayMonotonic(t *testing.T) {
	var pk uint64
	m := New(func(context.Context) agent.Status {
		return agent.Status{Table: &nftjson.Table{}, Classes: []agent.ClassStatus{{Class: model.PodToPod, Packets: pk, Bytes: pk * 100}},
			Offloaded: []string{"a", "b"}}
	})
	m.ObserveSync(time.Millisecond, agent.State{Healthy: true, Devices: []string{"gw", "eth0"}}, nil)
	want := func(v string) {
		t.Helper()
		exp := `
# HELP hostaccel_class_packets_total Packets of a traffic class that took the normal path through the forward chain (offloaded packets skip it).
# TYPE hostaccel_class_packets_total counter
hostaccel_class_packets_total{class="pod-to-pod"} ` + v + "\n"
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(exp), "hostaccel_class_packets_total"); err != nil {
			t.Error(err)
		}
	}
	pk = 10
	want("10")
	pk = 3 // table rebuilt: counters restarted
	want("13")
	pk = 5
	want("15")
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP hostaccel_offloaded_flows Conntrack entries offloaded to the flowtable right now.
# TYPE hostaccel_offloaded_flows gauge
hostaccel_offloaded_flows 2
# HELP hostaccel_devices Gateway and transport devices the fastpath serves.
# TYPE hostaccel_devices gauge
hostaccel_devices 2
# HELP hostaccel_healthy 1 when the last sync succeeded and nothing is degraded, else 0.
# TYPE hostaccel_healthy gauge
hostaccel_healthy 1
`), "hostaccel_offloaded_flows", "hostaccel_devices", "hostaccel_healthy"); err != nil {
		t.Error(err)
	}
}

// The agent's own resources are on /metrics: what a churn or restart test (and an operator)
// watches for leaks.
func TestProcessAndRuntimeMetrics(t *testing.T) {
	m := New(func(context.Context) agent.Status { return agent.Status{} })
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds"} {
		if !have[name] {
			t.Errorf("metrics lack %s", name)
		}
	}
}

// hostaccel_drift_repairs_total follows the agent's count per datapath, from 0 for each.
func TestDriftRepairs(t *testing.T) {
	m := New(func(context.Context) agent.Status { return agent.Status{} })
	want := func(ft, tc, lb string) {
		t.Helper()
		exp := `
# HELP hostaccel_drift_repairs_total Syncs that found a datapath's kernel state changed outside hostaccel (rules, programs, maps) and repaired it.
# TYPE hostaccel_drift_repairs_total counter
hostaccel_drift_repairs_total{datapath="flowtable"} ` + ft + `
hostaccel_drift_repairs_total{datapath="lb"} ` + lb + `
hostaccel_drift_repairs_total{datapath="sockmap"} 0
hostaccel_drift_repairs_total{datapath="tc"} ` + tc + "\n"
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(exp), "hostaccel_drift_repairs_total"); err != nil {
			t.Error(err)
		}
	}
	want("0", "0", "0")
	m.ObserveSync(time.Millisecond, agent.State{DriftRepairs: map[string]int{"lb": 1}}, nil)
	m.ObserveSync(time.Millisecond, agent.State{DriftRepairs: map[string]int{"lb": 1}}, nil)
	want("0", "0", "1")
	m.ObserveSync(time.Millisecond, agent.State{DriftRepairs: map[string]int{"lb": 3, "tc": 1}}, nil)
	want("0", "1", "3")
}

// The tc program's handed marks: the marked ends as a gauge, the agings (the epoch less one)
// as a counter that a reloaded program (epoch 1 again) does not lower.
func TestTCHandedMarks(t *testing.T) {
	h := tc.HandedMarks{Marked: 7, Of: 262144, Epoch: 3}
	m := New(func(context.Context) agent.Status { return agent.Status{TC: &tc.Status{Handed: &h}} })
	want := func(marked, agings string) {
		t.Helper()
		exp := `
# HELP hostaccel_tc_handed_agings_total Agings of the tc program's handed marks: the marks of client ends whose NAT-ed connections were gone were voided.
# TYPE hostaccel_tc_handed_agings_total counter
hostaccel_tc_handed_agings_total ` + agings + `
# HELP hostaccel_tc_handed_marked Client ends handed to the stack that the tc program has marked now (replies to them take the handed lookup and, if NAT-ed, the stack), of 262,144 marks; aged once more than 1/16 are set.
# TYPE hostaccel_tc_handed_marked gauge
hostaccel_tc_handed_marked ` + marked + "\n"
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(exp), "hostaccel_tc_handed_marked", "hostaccel_tc_handed_agings_total"); err != nil {
			t.Error(err)
		}
	}
	want("7", "2")
	h = tc.HandedMarks{Marked: 1, Of: 262144, Epoch: 1} // a new program set
	want("1", "2")
	h.Epoch = 2
	want("1", "3")
}

// A part of the kernel's state that a scrape could not read exports nothing of what it would
// have said, and hostaccel_status_read_errors names it: a sockmap status read half way (zero
// counters) was a reset, and the next good reading counted every message again; a table nft
// could not list was "not installed", no conntrack dump 0 offloaded flows.
func TestReadErrorsExportNothing(t *testing.T) {
	n := 0
	m := New(func(context.Context) agent.Status {
		n++
		st := agent.Status{Table: &nftjson.Table{}, Offloaded: []string{"a flow"},
			Sockmap: &sockmap.Status{Entered: map[string]uint64{}, Redirected: sockmap.Counter{Count: 1000}}}
		if n == 2 {
			st = agent.Status{Sockmap: &sockmap.Status{Entered: map[string]uint64{}}, Errors: map[string]string{
				"sockmap": "stats: EPERM", "nftables": "context deadline exceeded", "conntrack": "EBUSY"}}
		}
		return st
	})
	want := func(exp string, names ...string) {
		t.Helper()
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(exp), names...); err != nil {
			t.Error(err)
		}
	}
	m.Registry.Gather()
	want(`
# HELP hostaccel_status_read_errors 1 when the scrape could not read a part of the kernel's state (source: nftables, conntrack, tc, sockmap); that part's metrics are left out of the scrape.
# TYPE hostaccel_status_read_errors gauge
hostaccel_status_read_errors{source="conntrack"} 1
hostaccel_status_read_errors{source="nftables"} 1
hostaccel_status_read_errors{source="sockmap"} 1
hostaccel_status_read_errors{source="tc"} 0
`, "hostaccel_status_read_errors", "hostaccel_table_installed", "hostaccel_offloaded_flows", "hostaccel_sockmap_messages_total")
	want(`
# HELP hostaccel_sockmap_messages_total Messages (sendmsg, sendfile) of sockets in the map: redirected socket to socket, or passed to TCP.
# TYPE hostaccel_sockmap_messages_total counter
hostaccel_sockmap_messages_total{result="passed"} 0
hostaccel_sockmap_messages_total{result="redirected"} 1000
# HELP hostaccel_table_installed 1 when table inet hostaccel exists (absent when nft could not be read: hostaccel_status_read_errors).
# TYPE hostaccel_table_installed gauge
hostaccel_table_installed 1
# HELP hostaccel_offloaded_flows Conntrack entries offloaded to the flowtable right now.
# TYPE hostaccel_offloaded_flows gauge
hostaccel_offloaded_flows 1
`, "hostaccel_table_installed", "hostaccel_offloaded_flows", "hostaccel_sockmap_messages_total")
}
