package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hostaccel/hostaccel/internal/nftlist"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

var sample = Result{
	Kernel: "6.1.0-test",
	Features: []Feature{
		{Name: NFTables, Available: true},
		{Name: Flowtable, Detail: "nft: Could not process rule: No such file or directory; load nf_flow_table_inet"},
	},
}

func TestHasGet(t *testing.T) {
	if !sample.Has(NFTables) || sample.Has(Flowtable) || sample.Has(SockMap) {
		t.Errorf("Has: got nf_tables=%v flowtable=%v sockmap=%v, want true false false",
			sample.Has(NFTables), sample.Has(Flowtable), sample.Has(SockMap))
	}
	if got := sample.Get(Flowtable); got != sample.Features[1] {
		t.Errorf("Get(flowtable) = %+v", got)
	}
	if got := sample.Get(SockMap); got.Name != SockMap || got.Available {
		t.Errorf("Get(sockmap) = %+v, want an unavailable sockmap", got)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	sample.WriteTable(&b)
	want := "kernel: 6.1.0-test\n" +
		"FEATURE    AVAILABLE  DETAIL\n" +
		"nf_tables  yes        \n" +
		"flowtable  no         nft: Could not process rule: No such file or directory; load nf_flow_table_inet\n"
	if b.String() != want {
		t.Errorf("WriteTable:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestJSON(t *testing.T) {
	b, err := json.Marshal(sample)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kernel":"6.1.0-test","features":[{"name":"nf_tables","available":true},` +
		`{"name":"flowtable","available":false,"detail":"nft: Could not process rule: No such file or directory; load nf_flow_table_inet"}]}`
	if string(b) != want {
		t.Errorf("JSON:\n%s\nwant:\n%s", b, want)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil || back.Kernel != sample.Kernel || len(back.Features) != 2 || back.Features[1] != sample.Features[1] {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}

func TestFeatureDetail(t *testing.T) {
	if f := feature(TCX, nil, "hint"); !f.Available || f.Detail != "" {
		t.Errorf("available feature: %+v", f)
	}
	if f := feature(TCX, errors.New("bad\n  thing\n"), "hint"); f.Available || f.Detail != "bad; thing; hint" {
		t.Errorf("missing feature: %+v", f)
	}
	if f := feature(TCX, errors.New("bad"), ""); f.Detail != "bad" {
		t.Errorf("missing feature without hint: %+v", f)
	}
	if err := try(func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("try did not turn a panic into an error: %v", err)
	}
}

func TestNFTError(t *testing.T) {
	err := errors.New("/dev/stdin:2:1-79: Error: Could not process rule: No such file or directory\n" +
		"add flowtable inet hostaccel-probe ft { hook ingress priority filter ; devices = { lo } ; }\n" +
		"^^^^^^^^^^^^^^^\n" +
		"/dev/stdin:4:20-31: Error: Could not process rule: No such file or directory\n" +
		"add rule inet hostaccel-probe forward flow add @ft\n")
	if got := nftError(err).Error(); got != "nft: Could not process rule: No such file or directory" {
		t.Errorf("nftError = %q", got)
	}
	if nftError(nil) != nil {
		t.Error("nftError(nil) != nil")
	}
}

func ruleset(t *testing.T) []byte {
	t.Helper()
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	return out
}

var allFeatures = []string{NFTables, Flowtable, FlowtableCounter, NetdevFwd, Conntrack,
	ClsBPF, ClsFlower, TCX, RedirectNeigh, RedirectPeer, ConntrackKfuncs, SockMap, SockMapFIONREAD, SockMapBound}

// checkShape checks that r has every feature once, in order, and a reason for each missing one.
func checkShape(t *testing.T, r Result) {
	t.Helper()
	if r.Kernel == "" {
		t.Error("no kernel release")
	}
	if len(r.Features) != len(allFeatures) {
		t.Fatalf("got %d features, want %d: %+v", len(r.Features), len(allFeatures), r.Features)
	}
	for i, f := range r.Features {
		if f.Name != allFeatures[i] {
			t.Errorf("feature %d is %q, want %q", i, f.Name, allFeatures[i])
		}
		if !f.Available && f.Detail == "" {
			t.Errorf("%s is unavailable without a detail", f.Name)
		}
	}
}

// ForTC, the probe of `hostaccel apply` for a tc config, finds the conntrack kfuncs where Run
// does, whichever runs first: where nf_conntrack is a module, they are in its BTF, which is
// there only once it is loaded. Run's nft dry run of a conntrack rule loads it; ForTC read the
// BTF without, so on a freshly booted node (the VM's 6.1) `apply` refused datapath tc for
// want of the kfuncs until a `hostaccel probe` had loaded the module. This test comes before
// any of Run's in the package, so that in the VM nf_conntrack is not loaded when it starts.
func TestForTCFindsTheKfuncsBeforeRun(t *testing.T) {
	testbed.RequireRoot(t)
	was := KfuncsCache
	KfuncsCache = filepath.Join(t.TempDir(), "conntrack-kfuncs")
	defer func() { KfuncsCache = was }()
	haveKfuncs.Store(false) // read the BTF, not a yes of an earlier test
	_, err := os.Stat(conntrackMax)
	loaded := err == nil
	inVM := os.Getenv("HOSTACCEL_IN_VM") == "1"
	if inVM && loaded {
		t.Errorf("the VM boots without nf_conntrack, yet it is loaded: a test before this one loaded it, and this one tests nothing more than TestForTCAgreesWithRun")
	}

	tc := ForTC(context.Background())
	_, afterTC := os.Stat(conntrackMax)
	all := Run(context.Background())
	if !loaded && afterTC != nil && all.Has(Conntrack) {
		t.Errorf("ForTC left nf_conntrack unloaded (%v), which Run's probe loads: it read the kfuncs without their module", afterTC)
	}
	if got, run := tc.Get(ConntrackKfuncs), all.Get(ConntrackKfuncs); got.Available != run.Available {
		t.Errorf("%s, nf_conntrack loaded at the start %v: ForTC says available=%v (%s), Run after it %v (%s)",
			ConntrackKfuncs, loaded, got.Available, got.Detail, run.Available, run.Detail)
	}
	if inVM && !tc.Has(ConntrackKfuncs) {
		// Debian's 6.1 has them, in nf_conntrack's module BTF.
		t.Errorf("ForTC in the VM: %s unavailable (%s)", ConntrackKfuncs, tc.Get(ConntrackKfuncs).Detail)
	}
}

// TestRunFailsSoft runs with any privileges: without root every probe must still report.
func TestRunFailsSoft(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := Run(ctx)
	var table bytes.Buffer
	r.WriteTable(&table)
	t.Logf("euid %d:\n%s", os.Geteuid(), table.String())
	checkShape(t, r)
}

func TestRunHost(t *testing.T) {
	testbed.RequireRoot(t)
	before := ruleset(t)
	start := time.Now()
	r := Run(context.Background())
	took := time.Since(start)
	after := ruleset(t)

	var table bytes.Buffer
	r.WriteTable(&table)
	t.Logf("probe took %v:\n%s", took, table.String())

	if !bytes.Equal(before, after) {
		t.Errorf("nft ruleset changed by Run:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	checkShape(t, r)

	want := map[string]bool{}
	inVM := os.Getenv("HOSTACCEL_IN_VM") == "1"
	if inVM {
		// The Debian cloud kernel (6.1) of the VM tests has both as modules; checked
		// there, with nft 1.0.6, as was the flowtable counter.
		want[Flowtable] = true
		want[FlowtableCounter] = true
		want[ClsFlower] = true
		// 6.1 without the sockmap FIONREAD fix (the sockmap host tests' FIONREAD case fails
		// there too).
		want[SockMap] = true
		want[SockMapFIONREAD] = false
		want[SockMapBound] = true // fexit on tcp_bpf_recvmsg
	} else {
		for _, name := range []string{NFTables, NetdevFwd, Conntrack, ClsBPF, SockMap, RedirectNeigh} {
			want[name] = true
		}
		if strings.Contains(r.Kernel, "-fc-") {
			// The development host (6.18): no flowtable, no flower, cannot load
			// modules; but tcx and bpf_redirect_peer.
			want[Flowtable] = false
			want[ClsFlower] = false
			want[TCX] = true
			want[RedirectPeer] = true
			want[ConntrackKfuncs] = true // nf_conntrack built in, with BTF
			want[SockMapFIONREAD] = true
			want[SockMapBound] = true // the sock_recv_length raw tracepoint: fexit is refused (EPERM)
		}
	}
	for name, avail := range want {
		if f := r.Get(name); f.Available != avail {
			t.Errorf("%s: available=%v, want %v (detail: %s)", name, f.Available, avail, f.Detail)
		}
	}
}

// ForTC agrees with Run on every feature it reports. Where the kernel has tcx, it does not
// try cls_bpf and flower in a throwaway namespace (the tc datapath attaches with tcx there);
// where it has not, it tries them as Run does.
func TestForTCAgreesWithRun(t *testing.T) {
	testbed.RequireRoot(t)
	all := Run(context.Background())
	start := time.Now()
	r := ForTC(context.Background())
	t.Logf("ForTC took %v", time.Since(start))
	for _, f := range r.Features {
		if run := all.Get(f.Name); run.Available != f.Available {
			t.Errorf("%s: ForTC says available=%v (%s), Run %v (%s)", f.Name, f.Available, f.Detail, run.Available, run.Detail)
		}
	}
	for _, name := range []string{TCX, RedirectNeigh, RedirectPeer, ConntrackKfuncs} {
		if r.Get(name).Detail == "not probed" {
			t.Errorf("ForTC did not probe %s", name)
		}
	}
	for _, name := range []string{ClsBPF, ClsFlower} {
		probed := r.Get(name).Detail != "not probed"
		if all.Has(TCX) && probed {
			t.Errorf("the kernel has tcx, yet ForTC tried %s", name)
		}
		if !all.Has(TCX) && !probed {
			t.Errorf("the kernel lacks tcx, yet ForTC did not try %s", name)
		}
	}
}

func TestAllListsWhatRunProbes(t *testing.T) {
	r := Run(context.Background())
	if len(r.Features) != len(All) {
		t.Fatalf("Run probed %d features, All lists %d", len(r.Features), len(All))
	}
	for i, f := range r.Features {
		if f.Name != All[i] {
			t.Errorf("feature %d: Run %s, All %s", i, f.Name, All[i])
		}
	}
}

// A yes of the conntrack kfuncs is kept for the boot: from vmlinux until the next boot, from
// nf_conntrack's module while it is loaded; anything else in the file is no answer.
func TestKfuncsCache(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "conntrack-kfuncs")
	mod := filepath.Join(dir, "nf_conntrack")
	was := kfuncsModule
	kfuncsModule = mod
	defer func() { kfuncsModule = was }()
	if nftlist.BootID() == "" {
		t.Skip("no boot id here")
	}
	if kfuncsCached(path) {
		t.Fatal("no file: cached")
	}
	rememberKfuncs(path, "vmlinux")
	if !kfuncsCached(path) {
		t.Error("from vmlinux: not cached")
	}
	rememberKfuncs(path, "nf_conntrack")
	if kfuncsCached(path) {
		t.Error("from the module, not loaded: cached")
	}
	if err := os.Mkdir(mod, 0o755); err != nil {
		t.Fatal(err)
	}
	if !kfuncsCached(path) {
		t.Error("from the module, loaded: not cached")
	}
	for name, body := range map[string]string{
		"another boot":   "6f1b2c3d-0000-0000-0000-000000000000 vmlinux\n",
		"no source":      nftlist.BootID() + "\n",
		"unknown source": nftlist.BootID() + " btf\n",
		"empty":          "",
	} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if kfuncsCached(path) {
			t.Errorf("%s: cached", name)
		}
	}
}

// The flowtable counter's flag passes nft --check on a kernel before 5.5, which ignores the
// attribute: the release decides there.
func TestReleaseAtLeast(t *testing.T) {
	for rel, want := range map[string]bool{"6.1.0-26-cloud-amd64": true, "5.7.0": true, "5.6.19-foo": false,
		"5.4.0-150-generic": false, "4.19.0": false, "10.0": true, "weird": true} {
		if got := releaseAtLeast(rel, 5, 7); got != want {
			t.Errorf("releaseAtLeast(%q, 5, 7) = %v, want %v", rel, got, want)
		}
	}
}
