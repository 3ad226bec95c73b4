package probe

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/testbed"
)

func TestPrivilege(t *testing.T) {
	r := Result{Kernel: "k", MissingCapabilities: []string{CapSysAdmin}}
	var perr *PrivilegeError
	if err := r.Privilege(PartTC); !errors.As(err, &perr) || perr.Part != PartTC || len(perr.Missing) != 1 ||
		!strings.HasPrefix(err.Error(), "the tc datapath needs CAP_NET_ADMIN and CAP_SYS_ADMIN; this process lacks CAP_SYS_ADMIN (") {
		t.Errorf("tc without CAP_SYS_ADMIN: %v", err)
	}
	for _, p := range []string{PartLB, PartFlowtable, PartNFT} {
		if err := r.Privilege(p); err != nil {
			t.Errorf("%s without CAP_SYS_ADMIN: %v", p, err)
		}
	}
	if err := (Result{}).Privilege(PartTC); err != nil {
		t.Errorf("nothing missing: %v", err)
	}
	var b bytes.Buffer
	r.WriteTable(&b)
	if !strings.Contains(b.String(), "this process lacks CAP_SYS_ADMIN: the features that need it are reported missing below") {
		t.Errorf("WriteTable:\n%s", b.String())
	}
}

// The capabilities are read from the process: run this test binary with CAP_SYS_ADMIN
// dropped (setpriv), and with none.
func TestMissingCapsOfTheProcess(t *testing.T) {
	if os.Getenv("PROBE_PRINT_CAPS") == "1" {
		os.Stdout.WriteString(strings.Join(missingCaps(), ",") + "|" + permissionHint() + "\n")
		return
	}
	testbed.RequireRoot(t)
	if out, err := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+net_admin", "--", "true").CombinedOutput(); err != nil {
		t.Skipf("no util-linux setpriv (the VM has busybox's, without --bounding-set; scripts/test.sh runs this on the host): %v %s", err, out)
	}
	for caps, want := range map[string]string{
		"-all,+net_admin":            "CAP_SYS_ADMIN|this process lacks CAP_SYS_ADMIN (the tc datapath needs CAP_NET_ADMIN and CAP_SYS_ADMIN, the flowtable and the load balancer CAP_NET_ADMIN)",
		"-all":                       "CAP_NET_ADMIN,CAP_SYS_ADMIN|this process lacks CAP_NET_ADMIN and CAP_SYS_ADMIN (",
		"-all,+net_admin,+sys_admin": "|permission denied although this process has CAP_NET_ADMIN and CAP_SYS_ADMIN: a seccomp profile or an LSM",
	} {
		cmd := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set="+caps, "--",
			os.Args[0], "-test.run=^TestMissingCapsOfTheProcess$")
		cmd.Env = append(os.Environ(), "PROBE_PRINT_CAPS=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("bounding set %s: %v\n%s\nwant %q", caps, err, out, want)
		}
	}
}
