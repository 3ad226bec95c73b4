package agent

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/hostaccel/hostaccel/internal/conntrack"
	"github.com/hostaccel/hostaccel/internal/datapath"
	"github.com/hostaccel/hostaccel/internal/flowtable"
	"github.com/hostaccel/hostaccel/internal/lock"
	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/nftjson"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/sockmap"
	"github.com/hostaccel/hostaccel/internal/tc"
)

// DefaultStatePath is where a running agent publishes its state for `hostaccel status`.
const DefaultStatePath = "/run/hostaccel/agent.json"

// State is what the agent reports about itself.
type State struct {
	PID int `json:"pid"`
	// LockFile is the lock the agent holds while it runs ("": none recorded).
	LockFile string `json:"lockFile,omitempty"`
	// LBSocket is the load balancer API's unix socket ("": no API): status asks it (before, it
	// asked the default path only, and left out a load balancer whose socket was elsewhere).
	LBSocket   string          `json:"lbSocket,omitempty"`
	ConfigPath string          `json:"configPath"`
	Datapath   string          `json:"datapath"`
	Healthy    bool            `json:"healthy"`
	Degraded   []string        `json:"degraded,omitempty"` // why it cannot do all it was asked
	Devices    []string        `json:"devices"`
	Syncs      int             `json:"syncs"`
	SyncErrors int             `json:"syncErrors"`
	LastSync   time.Time       `json:"lastSync"`
	LastError  string          `json:"lastError,omitempty"`
	Plan       string          `json:"plan"`                // which datapath serves which classes
	PlanNotes  []string        `json:"planNotes,omitempty"` // why auto set a faster datapath aside
	LastResult datapath.Result `json:"lastResult"`
	// DriftRepairs counts, per datapath (flowtable, tc, lb), the syncs that found its kernel
	// state changed outside hostaccel and repaired it.
	DriftRepairs map[string]int `json:"driftRepairs,omitempty"`
	// Starting says what an agent that holds the lock waits for before its first sync
	// (PublishStarting); "" once it synced.
	Starting string `json:"starting,omitempty"`
	// Source is the config source's report (Kubernetes mode: connectivity and what it derived).
	Source json.RawMessage `json:"source,omitempty"`
}

// Status is `hostaccel status`: the kernel's view, plus the agent's if one runs.
type Status struct {
	Table     *nftjson.Table    `json:"table"` // nil: not installed
	Rules     []RuleStatus      `json:"rules"`
	Classes   []ClassStatus     `json:"classes"`
	Offloaded []string          `json:"offloaded"`         // conntrack entries with [OFFLOAD]
	TC        *tc.Status        `json:"tc,omitempty"`      // nil: the tc datapath is not attached
	Sockmap   *sockmap.Status   `json:"sockmap,omitempty"` // nil: the sockmap datapath is not attached
	Agent     *State            `json:"agent,omitempty"`
	Errors    map[string]string `json:"errors,omitempty"`
}

type RuleStatus struct {
	Comment string `json:"comment"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ClassStatus sums the counters of a class's rules: packets that took the normal path
// (counters stop growing once a connection is offloaded).
type ClassStatus struct {
	Class   model.Class `json:"class"`
	Rules   int         `json:"rules"`
	Packets uint64      `json:"packets"`
	Bytes   uint64      `json:"bytes"`
}

// Gather reads the kernel's state of hostaccel in this network namespace.
func Gather(ctx context.Context, m *datapath.Managers, statePath string) Status {
	st := Status{Errors: map[string]string{}}
	if m.TC != nil && probe.CheckPrivilege(probe.PartTC) == nil { // (see datapath.Managers.Apply)
		ts, err := m.TC.Status(ctx)
		if err != nil {
			st.Errors["tc"] = err.Error()
		} else if ts.Mode != "" {
			st.TC = &ts
		}
	}
	if m.Sockmap != nil {
		ss, err := m.Sockmap.Status(ctx)
		if err != nil {
			st.Errors["sockmap"] = err.Error()
		}
		st.Sockmap = ss
	}
	t, err := m.Flowtable.Observe(ctx)
	if err != nil {
		st.Errors["nftables"] = err.Error()
	}
	st.Table = t
	if t != nil && t.Chains[flowtable.ChainName] != nil {
		byClass := map[model.Class]*ClassStatus{}
		for _, r := range t.Chains[flowtable.ChainName].Rules {
			if !r.Counter {
				continue
			}
			st.Rules = append(st.Rules, RuleStatus{r.Comment, r.Packets, r.Bytes})
			c := flowtable.ClassOf(r.Comment)
			if c == "" {
				continue
			}
			if byClass[c] == nil {
				byClass[c] = &ClassStatus{Class: c}
			}
			byClass[c].Rules++
			byClass[c].Packets += r.Packets
			byClass[c].Bytes += r.Bytes
		}
		for _, c := range model.Classes {
			if cs := byClass[c]; cs != nil {
				st.Classes = append(st.Classes, *cs)
			}
		}
	}
	flows, err := conntrack.ListOffloaded(ctx)
	if err != nil {
		st.Errors["conntrack"] = err.Error()
	}
	for _, f := range flows {
		st.Offloaded = append(st.Offloaded, f.String())
	}
	sort.Strings(st.Offloaded)
	if statePath != "" {
		if b, err := os.ReadFile(statePath); err == nil {
			var a State
			if json.Unmarshal(b, &a) == nil && a.running() {
				st.Agent = &a
			}
		}
	}
	if len(st.Errors) == 0 {
		st.Errors = nil
	}
	return st
}

// running reports whether the agent that wrote a still runs: its PID is alive here and the
// lock it recorded is held. The PID alone is no proof: an agent in a container is PID 1 of
// its namespace, and on the node /proc/1 is init, long after the Pod is gone.
func (a *State) running() bool {
	return processAlive(a.PID) && (a.LockFile == "" || lock.Held(a.LockFile))
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}
