// Package bench reproduces the seed benchmark tables (netperf TCP_STREAM, TCP_RR and TCP_CRR
// for Pod-to-Pod, Pod-to-Service and External-to-NodePort; pktgen per-packet cost) on this
// machine, for the default node path, each hostaccel datapath, the Antrea and Kindnet
// rulesets and a direct link, side by side.
//
// A run builds a kind-like cluster out of network namespaces (Build, Plan), applies one
// Variant at a time to every node, runs the tests interleaved and repeated, and reports
// medians with their spread (Report: Markdown, JSON, PNG). Variants the running kernel lacks
// run inside the project's VM (vmtest/run-in-vm.sh); their cells are compared only with the
// VM's own default and direct runs.
package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// netperf tests.
const (
	TCPStream = "TCP_STREAM"
	TCPRR     = "TCP_RR"
	TCPCRR    = "TCP_CRR"
)

// Tests lists the netperf tests in report order.
var Tests = []string{TCPStream, TCPRR, TCPCRR}

// Traffic is a path through the cluster.
type Traffic string

const (
	PodToPod           Traffic = "pod-to-pod"
	PodToService       Traffic = "pod-to-service"
	ExternalToNodePort Traffic = "external-to-nodeport"
	// ExternalToLoadBalancer goes from the external client to a VIP of hostaccel's own load
	// balancer (internal/lb, a dnat service) on the server node.
	ExternalToLoadBalancer Traffic = "external-to-loadbalancer"
	// DirectLink is the direct variant's path: client and server on one veth, no hop.
	DirectLink Traffic = "direct"
)

// Traffics lists the cluster paths in report order.
var Traffics = []Traffic{PodToPod, PodToService, ExternalToNodePort, ExternalToLoadBalancer}

// Title is the traffic type as the seeds write it.
func (t Traffic) Title() string {
	switch t {
	case PodToPod:
		return "Pod-to-Pod"
	case PodToService:
		return "Pod-to-Service"
	case ExternalToNodePort:
		return "External-to-NodePort"
	case ExternalToLoadBalancer:
		return "External-to-LoadBalancer (dnat)"
	case DirectLink:
		return "no hop"
	case LocalPodToPod64:
		return "Pod-to-Pod (same node), 64 B"
	case LocalPodToPod64K:
		return "Pod-to-Pod (same node), 64 KiB"
	}
	return string(t)
}

// Direction is the way the per-packet flow crosses the node.
type Direction string

const (
	// PodToRemote: a local Pod -> the node (gateway in, transport out) -> a remote Pod.
	PodToRemote Direction = "pod-to-remote"
	// RemoteToPod: a remote Pod -> the node (transport in, gateway out) -> a local Pod.
	RemoteToPod Direction = "remote-to-pod"
)

// Directions lists the per-packet directions in report order.
var Directions = []Direction{PodToRemote, RemoteToPod}

// norm is the direction of a sample or cell; reports written before the reverse direction
// existed carry none, and measured the Pod -> remote one.
func (d Direction) norm() Direction {
	if d == "" {
		return PodToRemote
	}
	return d
}

// Title is how the report's tables name the direction.
func (d Direction) Title() string {
	switch d.norm() {
	case PodToRemote:
		return "Pod -> remote"
	case RemoteToPod:
		return "remote -> Pod"
	}
	return string(d)
}

// VM modes.
const (
	VMAuto   = "auto"
	VMAlways = "always"
	VMNever  = "never"
	// VMOnly measures in the VM only (no host run): the quick way to re-run its rows.
	VMOnly = "only"
)

// Options configure a run. Zero values take the defaults of Defaults.
type Options struct {
	Variants []string  // variant names; empty: every default variant
	Tests    []string  // netperf tests; empty: none (pktgen only) unless DefaultTests
	Traffic  []Traffic // cluster paths
	Reps     int       // repetitions of every cell
	Duration time.Duration
	Rules    int    // filter rules in the default node's forward chain
	Pin      string // "auto" (the last CPU), "none", or a CPU number
	Nodes    int    // nodes in the cluster (2 or 3)
	Services int    // extra (idle) Services in the kube-proxy-like ruleset

	Pktgen         bool
	PktgenDuration time.Duration // per round, in the generator's clock
	PktgenSize     int           // bytes per packet (pktgen pkt_size)
	// PktgenDirections are the directions measured per packet; empty: both.
	PktgenDirections []Direction

	VM         string        // auto, always or never
	VMDuration time.Duration // netperf duration inside the VM (guest clock)
	VMReps     int           // repetitions inside the VM; 0: Reps
	// VMBoots boots the VM this many times (0: once), each boot running every cell VMReps
	// times; the samples are pooled. icount makes a boot's cells repeat, but each boot draws
	// its own hash seeds and ports, which move a variant's cells together by up to ~0.7%.
	VMBoots int
	// PhaseSpread starts a variant's cells in repetition k (k-1)/Reps of this period after
	// its install (0: at once). The kernel's once-a-second work (the flowtable's garbage
	// collection frees the flows of the connections before it) then falls at every phase of
	// a cell for every variant, instead of at one phase that the install's own length
	// decides: under icount that phase repeats run after run, and moved 1 s TCP_CRR cells of
	// one ruleset by up to 0.7% with the way it was installed. The VM's runs use 1 s.
	PhaseSpread time.Duration
	VMTest      string        // directory holding run-in-vm.sh; empty: search
	VMTimeout   time.Duration // 0: estimated from the plan
	VMICount    bool          // deterministic icount mode (-i)

	// Here runs everything in this kernel and never starts a VM (the VM part of a run is
	// such a run inside the guest).
	Here bool
	// RaiseConntrackMax sets nf_conntrack_max to at least 262144 (the VM's 1 GiB gives
	// 8192, which TCP_CRR can fill). Only for a kernel the run owns (the VM).
	RaiseConntrackMax bool
	// Command is the command line recorded in the report.
	Command string
}

// Defaults returns the options of a plain `hostaccel bench`.
func Defaults() Options {
	return Options{
		Tests:            slices.Clone(Tests),
		Traffic:          slices.Clone(Traffics),
		Reps:             5,
		Duration:         5 * time.Second,
		Rules:            100,
		Pin:              "auto",
		Nodes:            3,
		Services:         50,
		Pktgen:           true,
		PktgenDuration:   time.Second,
		PktgenSize:       64,
		PktgenDirections: slices.Clone(Directions),
		VM:               VMAuto,
		VMDuration:       time.Second,
		VMICount:         true,
	}
}

// Validate checks the options and fills in defaults for zero values.
func (o *Options) Validate() error {
	d := Defaults()
	if o.Reps <= 0 {
		o.Reps = d.Reps
	}
	if o.Duration <= 0 {
		o.Duration = d.Duration
	}
	if o.VMDuration <= 0 {
		o.VMDuration = d.VMDuration
	}
	if o.VMBoots <= 0 {
		o.VMBoots = 1
	}
	if o.PktgenDuration <= 0 {
		o.PktgenDuration = d.PktgenDuration
	}
	if o.PktgenSize == 0 {
		o.PktgenSize = d.PktgenSize
	}
	if o.Nodes == 0 {
		o.Nodes = d.Nodes
	}
	if o.Pin == "" {
		o.Pin = d.Pin
	}
	if o.VM == "" {
		o.VM = d.VM
	}
	if len(o.PktgenDirections) == 0 {
		o.PktgenDirections = d.PktgenDirections
	}
	var errs []string
	for _, t := range o.Tests {
		if !slices.Contains(Tests, t) {
			errs = append(errs, fmt.Sprintf("tests: unknown test %q (want %s)", t, strings.Join(Tests, ", ")))
		}
	}
	for _, t := range o.Traffic {
		if !slices.Contains(allTraffics(), t) {
			errs = append(errs, fmt.Sprintf("traffic: unknown traffic %q (want %s)", t, joinTraffic(allTraffics())))
		}
	}
	for _, v := range o.Variants {
		if _, ok := Lookup(v); !ok {
			errs = append(errs, fmt.Sprintf("variants: unknown variant %q (want %s)", v, strings.Join(Names(), ", ")))
		}
	}
	if o.Rules < 0 || o.Rules > 100000 {
		errs = append(errs, fmt.Sprintf("rules: %d out of range 0..100000", o.Rules))
	}
	if o.Nodes < 2 || o.Nodes > 3 {
		errs = append(errs, fmt.Sprintf("nodes: %d, want 2 or 3", o.Nodes))
	}
	if o.Services < 0 || o.Services > 200 {
		errs = append(errs, fmt.Sprintf("services: %d out of range 0..200", o.Services))
	}
	if o.PktgenSize < 60 || o.PktgenSize > 1500 {
		errs = append(errs, fmt.Sprintf("pktgen-size: %d out of range 60..1500", o.PktgenSize))
	}
	if _, err := ParsePin(o.Pin, 1); err != nil {
		errs = append(errs, err.Error())
	}
	for _, d := range o.PktgenDirections {
		if !slices.Contains(Directions, d) {
			errs = append(errs, fmt.Sprintf("pktgen-directions: unknown direction %q (want %s)", d, joinDirections(Directions)))
		}
	}
	if !slices.Contains([]string{VMAuto, VMAlways, VMNever, VMOnly}, o.VM) {
		errs = append(errs, fmt.Sprintf("vm: %q, want auto, always, never or only", o.VM))
	}
	if len(o.Tests) == 0 && !o.Pktgen {
		errs = append(errs, "nothing to measure: no tests and no pktgen")
	}
	if len(o.Tests) > 0 && len(o.Traffic) == 0 {
		errs = append(errs, "traffic: empty")
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench: %s", strings.Join(errs, "; "))
	}
	return nil
}

func joinTraffic(ts []Traffic) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

func joinDirections(ds []Direction) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = string(d)
	}
	return strings.Join(s, ",")
}

// Pinning says where netperf, netserver and pktgen run.
type Pinning struct {
	Enabled bool `json:"enabled"`
	CPU     int  `json:"cpu"`
	// How is the exact prefix and flag, for the report.
	How string `json:"how"`
}

// ParsePin resolves a --pin value on a machine with ncpu CPUs: "auto" is the last CPU (CPU 1
// on two cores), "none" disables pinning.
func ParsePin(s string, ncpu int) (Pinning, error) {
	switch s {
	case "none", "off", "false":
		return Pinning{How: "not pinned"}, nil
	case "auto", "":
		cpu := max(ncpu-1, 0)
		return pinOn(cpu), nil
	}
	cpu, err := strconv.Atoi(s)
	if err != nil || cpu < 0 {
		return Pinning{}, fmt.Errorf("pin: %q, want auto, none or a CPU number", s)
	}
	if cpu >= ncpu {
		return Pinning{}, fmt.Errorf("pin: CPU %d does not exist (%d CPUs)", cpu, ncpu)
	}
	return pinOn(cpu), nil
}

func pinOn(cpu int) Pinning {
	return Pinning{Enabled: true, CPU: cpu, How: fmt.Sprintf("taskset -c %d netperf ... -T %d,%d; taskset -c %d netserver; pktgen thread kpktgend_%d", cpu, cpu, cpu, cpu, cpu)}
}

// prefix returns the command prefix that pins a process.
func (p Pinning) prefix() []string {
	if !p.Enabled {
		return nil
	}
	return []string{"taskset", "-c", strconv.Itoa(p.CPU)}
}

// CommandLine writes a command line as a shell takes it back: empty arguments and those
// with spaces, quotes or `$` single-quoted (`--tests ”`).
func CommandLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
