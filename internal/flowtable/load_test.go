package flowtable

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

// Every golden ruleset is valid nft for the kernel, not only for the Fake: each loads into a
// fresh namespace of the host kernel, which has no flowtable, so without the flowtable and
// with `counter` for `flow add` (the VM tests load them whole). A chain named after an nft
// keyword, for one, passes the Fake and fails here.
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
	flowtableLine := regexp.MustCompile(`(?m)^add flowtable .*$`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		script := flowtableLine.ReplaceAllString(string(b), "")
		script = strings.ReplaceAll(script, "flow add @"+FlowtableName, "counter")
		if err := ns.NFT(script); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if out, err := ns.Exec("nft", "delete", "table", string(Family), TableName); err != nil {
			t.Errorf("%s: %v %s", f, err, out)
		}
	}
}
