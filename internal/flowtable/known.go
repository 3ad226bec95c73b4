package flowtable

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hostaccel/hostaccel/internal/nftlist"
	"github.com/hostaccel/hostaccel/internal/runfile"
)

// A Manager knows the table as its last apply left it (its fingerprint), and takes any other
// table for someone's change, which it repairs by a rebuild. A new process (a one-shot
// `hostaccel apply`, an agent restarted) knew nothing, and compared only the rules' comments:
// a rule edited in place with its comment kept stayed. So Apply writes the fingerprint to a
// file per network namespace (KnownDir) and a new Manager starts from it. The fingerprint is
// of the whole listing: unlike the load balancer's cache (lb/known.go) it needs no ruleset
// generation to be trusted, only the namespace and the boot it was written in.

// DefaultKnownDir holds the files (tmpfs: a reboot empties it, as it empties the ruleset).
const DefaultKnownDir = "/run/hostaccel"

// knownFormat names the file's layout and the fingerprint's (nftjson.Table.Fingerprint): a
// file of another is ignored.
const knownFormat = "hostaccel-flowtable-known/2"

type knownFile struct {
	Format      string   `json:"format"`
	NetNS       uint64   `json:"netns"`
	Boot        string   `json:"boot"`
	Fingerprint string   `json:"fingerprint"`
	Devices     []string `json:"devices"`
}

func (m *Manager) knownPath(ns nftlist.Generation) string {
	return filepath.Join(m.KnownDir, fmt.Sprintf("flowtable-known-%d.json", ns.NetNSInode))
}

// recall starts a Manager that knows nothing from the file of its namespace, if it has one
// written in this namespace and boot.
func (m *Manager) recall() {
	if m.KnownDir == "" || m.last != "" {
		return
	}
	ns := nftlist.Namespace()
	if ns.NetNS == 0 || ns.Boot == "" {
		return
	}
	b, err := os.ReadFile(m.knownPath(ns))
	if err != nil {
		return
	}
	var f knownFile
	if json.Unmarshal(b, &f) != nil || f.Format != knownFormat || f.NetNS != ns.NetNS || f.Boot != ns.Boot {
		return
	}
	m.last, m.lastDevices, m.written = f.Fingerprint, f.Devices, f.Fingerprint
}

// remember writes what the Manager knows for the next process; with nothing known, it
// removes the file. A cache: a file that cannot be written leaves the next process to compare
// comments, as before.
func (m *Manager) remember() {
	if m.KnownDir == "" || m.last == "" && m.cleared {
		return // (an agent without the flowtable removes the table at every sync)
	}
	ns := nftlist.Namespace()
	path := m.knownPath(ns)
	// Tried once per fingerprint: where the file cannot be (no namespace cookie before Linux
	// 5.14, /run read-only), the next syncs do not try again.
	m.written, m.cleared = m.last, m.last == ""
	if m.last == "" || ns.NetNS == 0 || ns.Boot == "" {
		_ = os.Remove(path)
		return
	}
	b, err := json.Marshal(knownFile{Format: knownFormat, NetNS: ns.NetNS, Boot: ns.Boot, Fingerprint: m.last, Devices: m.lastDevices})
	if err != nil || os.MkdirAll(m.KnownDir, 0o755) != nil {
		return
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	m.touched = time.Now()
	if os.WriteFile(tmp, b, 0o600) != nil || os.Rename(tmp, path) != nil {
		_ = os.Remove(tmp)
		_ = os.Remove(path) // (forget removed it before the change; a file left would lie)
		return
	}
	runfile.Prune(path, "flowtable-known-*.json", runfile.Keep) // (gone namespaces' files)
}

// touch marks the file the Manager wrote as in use, at most every touchEvery: runfile.Prune
// keeps the most recently modified files, and an agent whose table does not change would
// lose its own first to the applies of short-lived namespaces (its restart would then compare
// rule comments only).
func (m *Manager) touch() {
	if m.KnownDir == "" || m.written == "" || time.Since(m.touched) < touchEvery {
		return
	}
	m.touched = time.Now()
	_ = os.Chtimes(m.knownPath(nftlist.Namespace()), m.touched, m.touched)
}

// touchEvery is how often touch marks the file.
const touchEvery = time.Minute

// forget removes the known file before a transaction changes the table, so that no file
// says what the table was before it: a process that dies between the commit and the file's
// rewrite (the reading after the commit, the apply's memory peak, lies there) left the old
// fingerprint, and the next process took its predecessor's change for someone else's (drift:
// a rebuild that flushes every offloaded flow). Without the file the next process compares
// the rules' comments.
func (m *Manager) forget() {
	if m.KnownDir == "" {
		return
	}
	_ = os.Remove(m.knownPath(nftlist.Namespace()))
	m.written = ""
}
