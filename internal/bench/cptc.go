package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hostaccel/hostaccel/internal/tc"
)

// tcAgent runs the agent with the tc datapath and r.n peer Pod CIDRs (one route each) and
// rewrites its config file (renamed over, as config management does) with one CIDR replaced,
// then back, 24 times a repetition, 1.5 s apart (past minSyncInterval: each an event after a
// quiet spell; 36 s: what the agent does every resync period, 30 s by default, falls among
// them): the agent's watch of the file, its parse of all of it and the sync, until the
// program's map holds the new CIDR (a lookup every millisecond from here: BPF maps tell no one
// of a change). Also the agent's start until the maps hold every CIDR, and its memory.
func (r *cpRun) tcAgent(ctx context.Context) error {
	if err := r.node(ctx, r.n); err != nil {
		return err
	}
	p := filepath.Join(r.dir, "tc-agent.yaml")
	write := func(changed bool) error {
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, []byte(nodeConfig("tc", r.n, changed)), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, p)
	}
	if err := write(false); err != nil {
		return err
	}
	start := time.Now()
	agent, err := r.startFileAgent(ctx, p)
	if err != nil {
		return err
	}
	defer func() { agent.stop(); r.keepLog(agent) }()

	up := r.rep.cell(r.part, r.n, "agent start until every peer CIDR is in the program's map")
	var addrs *ebpf.Map
	if _, err := r.awaitAgent(up, agent, start, 20*time.Millisecond, "the agent did not load the program", func() bool {
		addrs, err = r.tcAddrs(ctx)
		return addrs != nil || err != nil
	}); err != nil {
		return err
	}
	if err != nil {
		return err
	}
	defer addrs.Close()
	last := peerCIDR(r.n - 1)
	seen, err := r.awaitAgent(up, agent, start, 5*time.Millisecond, last.String()+" not in the map", func() bool {
		return hasPrefix(addrs, last)
	})
	if err != nil {
		return err
	}
	up.Seconds = append(up.Seconds, seen.Sub(start).Seconds())

	file := r.rep.cell(r.part, r.n, "one CIDR replaced: config file rewritten until the program's map has it")
	const rewrites = 24
	for k := range rewrites {
		changed := k%2 == 0
		want := peerCIDR(0)
		if changed {
			want = peerCIDR(r.n)
		}
		time.Sleep(1500 * time.Millisecond)
		t0 := time.Now()
		if err := write(changed); err != nil {
			return err
		}
		found := hasPrefix(addrs, want)
		for ; !found && time.Since(t0) <= 10*time.Second; found = hasPrefix(addrs, want) {
			time.Sleep(time.Millisecond)
		}
		if found {
			file.Seconds = append(file.Seconds, time.Since(t0).Seconds())
		} else {
			file.Seconds = append(file.Seconds, math.NaN())
			file.Errors = append(file.Errors, fmt.Sprintf("%s not in the map after 10s", want))
		}
	}
	r.said = append(r.said, fmt.Sprintf("agent start %.2fs, file rewrites %v", up.Seconds[len(up.Seconds)-1], file.Seconds[len(file.Seconds)-rewrites:]))
	if rss, _ := procMemMiB(agent.cmd.Process.Pid); !math.IsNaN(rss) {
		file.MaxRSSMiB = append(file.MaxRSSMiB, rss)
	}
	return nil
}

// tcAddrs opens the IPv4 prefix map of the tc program attached in the namespace (nil while
// there is none yet), found by `hostaccel status`.
func (r *cpRun) tcAddrs(ctx context.Context) (*ebpf.Map, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", r.ns, r.o.Bin, "status", "-o", "json").Output()
	if err != nil {
		return nil, nil // not yet
	}
	var st struct {
		TC *struct {
			ProgramID ebpf.ProgramID `json:"programID"`
		} `json:"tc"`
	}
	if json.Unmarshal(out, &st) != nil || st.TC == nil || st.TC.ProgramID == 0 {
		return nil, nil
	}
	return tc.OpenAddrTrie(st.TC.ProgramID, netip.PrefixFrom(netip.IPv4Unspecified(), 0)) // the IPv4 trie
}

// hasPrefix reports whether the program's IPv4 trie holds p.
func hasPrefix(m *ebpf.Map, p netip.Prefix) bool {
	return m.Lookup(tc.AddrKey(p), make([]byte, m.ValueSize())) == nil
}
