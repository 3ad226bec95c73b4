package flowtable

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Every golden ruleset is valid nft for the kernel, not only for the Fake: each loads into a
// fresh namespace. Where the kernel has the flowtable (the VM: scripts/test.sh runs this
// package there with HOSTACCEL_REQUIRE_FLOWTABLE=1) they load whole; on a kernel without it
// (this host), without the flowtable and with `counter` for `flow add`. A chain named after
// an nft keyword, for one, passes the Fake and fails here.
// flowtableIn probes the kernel from ns and reports whether it has the flowtable with its
// counter; where the tests must have it (the VM, HOSTACCEL_REQUIRE_FLOWTABLE=1) it fails
// them when it has not.
func flowtableIn(t *testing.T, ns *testbed.NS) (probe.Result, bool) {
	t.Helper()
	var caps probe.Result
	ns.Do(func() error { caps = probe.Run(context.Background()); return nil })
	whole := caps.Has(probe.Flowtable) && caps.Has(probe.FlowtableCounter)
	if !whole && (os.Getenv("HOSTACCEL_REQUIRE_FLOWTABLE") == "1" || os.Getenv("HOSTACCEL_IN_VM") == "1") {
		t.Fatalf("this kernel has no flowtable (with its counter): %s", caps.Get(probe.Flowtable).Detail)
	}
	return caps, whole
}

func TestGoldensLoad(t *testing.T) {
	testbed.RequireRoot(t)
	files, err := filepath.Glob(filepath.Join("testdata", "*.nft"))
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	ns, err := testbed.NewNS("goldens")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	caps, whole := flowtableIn(t, ns)
	t.Logf("kernel %s: goldens loaded whole: %v", caps.Kernel, whole)
	flowtableLine := regexp.MustCompile(`(?m)^add flowtable .*$`)
	devicesClause := regexp.MustCompile(`devices = \{[^}]*\} ; `)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The namespace has none of the goldens' devices: the flowtable is created without
		// them (its hook, flags and the rules' `flow add` still go through the kernel).
		script := devicesClause.ReplaceAllString(string(b), "")
		if !whole {
			script = flowtableLine.ReplaceAllString(script, "")
			script = strings.ReplaceAll(script, "flow add @"+FlowtableName, "counter")
		}
		if err := ns.NFT(script); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if out, err := ns.Exec("nft", "delete", "table", string(Family), TableName); err != nil {
			t.Errorf("%s: %v %s", f, err, out)
		}
	}
}

// A device named like an nft keyword (a bridge called "bridge", a VLAN device "vlan") is a
// valid interface name, so the config takes it; the flowtable's device list must still parse
// (a review found every transaction failing with "syntax error, unexpected vlan"). On a
// kernel with the flowtable the ruleset loads; without it, nft's check (-c) must get past the
// parser to the kernel.
func TestKeywordDeviceNames(t *testing.T) {
	testbed.RequireRoot(t)
	ns, err := testbed.NewNS("ftkw")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	caps, whole := flowtableIn(t, ns)
	devs := []string{"vlan", "bridge", "counter", "ip"}
	for i := 0; i < len(devs); i += 2 {
		if out, err := ns.Exec("ip", "link", "add", devs[i], "type", "veth", "peer", "name", devs[i+1]); err != nil {
			t.Fatalf("ip link add %s: %v %s", devs[i], err, out)
		}
	}
	s := base()
	s.Classes = []model.Class{model.PodToPod}
	s.Gateways, s.Transports = devs[:1], devs[1:]
	s.Normalize()
	tx := knftables.NewFake(Family, TableName).NewTransaction()
	Render(s, Options{FlowtableCounter: caps.Has(probe.FlowtableCounter)}).AddAll(tx)
	script := tx.String()
	if !strings.Contains(script, `"vlan"`) {
		t.Errorf("the device list leaves vlan unquoted:\n%s", regexp.MustCompile(`(?m)^add flowtable .*$`).FindString(script))
	}
	if whole {
		if err := ns.NFT(script); err != nil {
			t.Fatalf("the ruleset with devices %v: %v", devs, err)
		}
		return
	}
	f := filepath.Join(t.TempDir(), "ft.nft")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := ns.Exec("nft", "-c", "-f", f)
	t.Logf("kernel %s (no flowtable): nft -c: %v", caps.Kernel, err)
	if strings.Contains(out, "syntax error") {
		t.Errorf("nft cannot parse the device list %v:\n%s", devs, out)
	}
}
