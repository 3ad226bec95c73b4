package lb

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is the load balancer as the agent sees it: every service with its backends'
// effective and health states, and the last sync.
type Status struct {
	Services   []ServiceStatus `json:"services"`
	LastSync   time.Time       `json:"lastSync,omitzero"`
	LastError  string          `json:"lastError,omitempty"`
	LastResult Result          `json:"lastResult"`
	StateFile  string          `json:"stateFile,omitempty"`
	Errors     []string        `json:"errors,omitempty"` // reading the kernel's counters
	Reads      ReadCounts      `json:"reads"`            // of the kernel since the start (with counters)

	countersFailed bool // the counters' reading failed: Packets are partial
}

// ServiceStatus is one service.
type ServiceStatus struct {
	Name      string   `json:"name"`
	Origin    string   `json:"origin"` // config, api
	Topology  string   `json:"topology"`
	Protocol  string   `json:"protocol"`
	Scheduler string   `json:"scheduler"`
	VIPs      []string `json:"vips"`
	Ports     []int    `json:"ports"`
	Skipped   string   `json:"skipped,omitempty"`
	// Packets counted by the service's chains: new connections (snat, dnat; later packets
	// follow conntrack) or every packet (dsr, stateless-dnat).
	Packets uint64 `json:"packets"`
	// TableFull: packets sent by a hash of their flow (client, with persistence) because the
	// service's flow table was full (flowTableSize): not recorded, they keep their backend
	// only while the table stays full (docs/lb.md).
	TableFull uint64          `json:"tableFull,omitempty"`
	Backends  []BackendStatus `json:"backends"`
	Service   Service         `json:"definition"`

	packetParts map[string]uint64 // Packets by kernel counter ("table counter"), which restart apart
	fullParts   map[string]uint64 // TableFull so
}

// BackendStatus is one backend.
type BackendStatus struct {
	Key      string `json:"key"`
	Address  string `json:"address"`
	Port     int    `json:"port,omitempty"`
	Weight   int    `json:"weight"`
	Priority int    `json:"priority"`
	State    string `json:"state"` // admin state
	Active   bool   `json:"active"`
	Known    bool   `json:"known"`
	Reason   string `json:"reason,omitempty"`
	ID       uint32 `json:"id,omitempty"`
	MAC      string `json:"mac,omitempty"`
	Health   Health `json:"health"`
}

// Comment endings of the rules whose counters measure a service.
const (
	whatNewConnections = "new connections"
	whatPackets        = "packets"
	// "flow table full", "client table full": packets sent by a hash of their key, the
	// service's dynamic map being full (recorder)
	whatTableFull = "table full"
)

// Status reports the current state; with counters it reads the kernel's rule counters.
func (r *Runtime) Status(ctx context.Context, counters bool) Status {
	return r.status(ctx, counters, "")
}

// ServiceStatus is Status of the one service named name (an API answer about one service
// need not build the status of thousands).
func (r *Runtime) ServiceStatus(ctx context.Context, name string, counters bool) (ServiceStatus, bool) {
	return r.status(ctx, counters, name).Service(name)
}

// status builds Status, of every service or of the one named only.
func (r *Runtime) status(ctx context.Context, counters bool, only string) Status {
	r.mu.Lock()
	st := Status{LastSync: r.lastSync, LastResult: r.result, StateFile: r.overlayPath}
	if r.lastErr != nil {
		st.LastError = r.lastErr.Error()
	}
	d, mgr, ov, checker := r.desired, r.mgr, r.overlay, r.checker
	r.mu.Unlock()
	if d == nil {
		return st
	}
	// Health as the checks left it now: the desired state's is the last sync's, and checks
	// run between syncs, which only a transition triggers (the counts, last check and error
	// of a backend failing fewer than fall checks in a row would show nothing).
	// (one service's only, for the answer to an API change, not a copy of thousands)
	var health map[string]Health
	switch {
	case checker == nil:
	case only == "":
		health = checker.Health()
	default:
		var keys []string
		for _, ss := range d.Services {
			if ss.Service.Name == only {
				for _, b := range ss.Backends {
					keys = append(keys, HealthKey(only, b.Key))
				}
			}
		}
		health = checker.healthOf(keys)
	}
	packets, parts := map[string]uint64{}, map[string]map[string]uint64{}
	full, fullParts := map[string]uint64{}, map[string]map[string]uint64{}
	if counters && mgr != nil {
		// The counters' names and comments as the last apply left them (under the manager's
		// lock, briefly), then the kernel's numbers without it.
		r.mgrMu.Lock()
		names := mgr.CounterTables()
		st.Reads = mgr.Reads
		r.mgrMu.Unlock()
		tables, err := mgr.ReadCounters(ctx, names)
		if err != nil {
			st.Errors = append(st.Errors, err.Error())
			st.countersFailed = true
		}
		for ref, cs := range tables {
			for name, c := range cs {
				svc, what, ok := parseComment(c.Comment)
				sum, by := packets, parts
				switch {
				case !ok:
					continue
				case what == whatNewConnections || what == whatPackets:
				case strings.HasSuffix(what, " "+whatTableFull): // flow table full, client table full
					sum, by = full, fullParts
				default:
					continue
				}
				sum[svc] += c.Packets
				if by[svc] == nil {
					by[svc] = map[string]uint64{}
				}
				by[svc][ref.String()+" "+name] = c.Packets
			}
		}
	}
	for _, ss := range d.Services {
		if only != "" && ss.Service.Name != only {
			continue
		}
		s := ServiceStatus{Name: ss.Service.Name, Origin: "config", Topology: ss.Topology, Protocol: ss.Protocol,
			Scheduler: ss.Sched, VIPs: ss.Service.VIPs, Ports: ss.Ports, Skipped: ss.Skipped, Packets: packets[ss.Service.Name],
			TableFull: full[ss.Service.Name], Service: ss.Service, packetParts: parts[ss.Service.Name], fullParts: fullParts[ss.Service.Name]}
		if ov.index(ss.Service.Name) >= 0 {
			s.Origin = "api"
		}
		for _, b := range ss.Backends {
			bs := BackendStatus{Key: b.Key, Address: b.Address, Port: b.Port, Weight: b.Weight, Priority: b.Priority,
				State: b.State, Active: b.Active, Known: b.Known, Reason: b.Reason, Health: b.Health}
			if h, ok := health[HealthKey(ss.Service.Name, b.Key)]; ok {
				bs.Health = h // active, known and reason stay the last sync's: the kernel's
			}
			if ss.Topology == DSR || ss.Topology == StatelessDNAT {
				bs.ID = b.ID
			}
			if b.MAC != nil {
				bs.MAC = b.MAC.String()
			}
			s.Backends = append(s.Backends, bs)
		}
		st.Services = append(st.Services, s)
	}
	return st
}

// parseComment splits "web v4: new connections [1a2b3c4d]" into "web", "new connections".
func parseComment(c string) (svc, what string, ok bool) {
	head, rest, ok := strings.Cut(c, ": ")
	if !ok {
		return "", "", false
	}
	svc, fam, ok := strings.Cut(head, " ")
	if !ok || (fam != "v4" && fam != "v6") {
		return "", "", false
	}
	what, _, _ = strings.Cut(rest, " [")
	return svc, what, true
}

// WriteStatus prints st for people.
func WriteStatus(w io.Writer, st Status) {
	fmt.Fprintf(w, "load balancer: %d services", len(st.Services))
	if !st.LastSync.IsZero() {
		fmt.Fprintf(w, ", last sync %s", st.LastSync.Format("15:04:05"))
	}
	fmt.Fprintln(w)
	if st.LastError != "" {
		fmt.Fprintf(w, "  last error: %s\n", st.LastError)
	}
	for _, e := range st.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
	for _, s := range st.Services {
		fmt.Fprintln(w)
		WriteService(w, s)
	}
}

// WriteService prints one service and its backends for people.
func WriteService(w io.Writer, s ServiceStatus) {
	{
		fmt.Fprintf(w, "service %s (%s): %s %s %s, %s, %d packets", s.Name, s.Origin, strings.Join(s.VIPs, ","),
			s.Protocol, joinInts(s.Ports), s.Topology+"/"+s.Scheduler, s.Packets)
		if s.TableFull > 0 {
			fmt.Fprintf(w, ", %d sent by hash, the flow table full", s.TableFull)
		}
		if s.Skipped != "" {
			fmt.Fprintf(w, " NOT INSTALLED: %s", s.Skipped)
		}
		fmt.Fprintln(w)
		if in := s.Service.Internal; in != nil {
			var who []string
			if len(in.Sources) > 0 {
				who = append(who, strings.Join(in.Sources, ","))
			}
			if in.LocalHost {
				who = append(who, "this host")
			}
			fmt.Fprintf(w, "  internal clients (%s): served by %s\n", strings.Join(who, ", "), in.Service)
		}
		if s.Service.InternalOnly {
			fmt.Fprintf(w, "  internal only: serves the internal clients of other services, not clients of %s\n", strings.Join(s.VIPs, ","))
		}
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "  BACKEND\tWEIGHT\tPRIO\tADMIN\tHEALTH\tIN MAPS\tCHECKED\tTRANSITIONS\tWHY")
		for _, b := range s.Backends {
			in := "no"
			switch {
			case b.Active:
				in = "yes"
			case b.Known:
				in = "established only"
			}
			checked := "-"
			if !b.Health.LastCheck.IsZero() {
				checked = b.Health.LastCheck.Format("15:04:05.000")
			}
			why := b.Reason
			if b.Health.LastError != "" && !strings.Contains(why, b.Health.LastError) {
				why = strings.TrimSpace(why + " (last check: " + b.Health.LastError + ")")
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", b.Key, b.Weight, b.Priority, b.State, b.Health.State,
				in, checked, b.Health.Transitions, why)
		}
		tw.Flush()
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// Service returns one service's status.
func (st Status) Service(name string) (ServiceStatus, bool) {
	i := slices.IndexFunc(st.Services, func(s ServiceStatus) bool { return s.Name == name })
	if i < 0 {
		return ServiceStatus{}, false
	}
	return st.Services[i], true
}
