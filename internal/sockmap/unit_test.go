package sockmap

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/model"
)

// The hierarchy's root is found by what the kernel says of the mount point, not by the root
// mountinfo shows (relative to the reader's cgroup namespace).
func TestCgroup2Mount(t *testing.T) {
	roots := map[string]bool{"/sys/fs/cgroup/unified": true, "/sys/fs/cgroup": true, "/mnt/cg v2": true, "/host/cgroup": true}
	isRoot := func(dir string) bool { return roots[dir] }
	for _, tc := range []struct{ name, in, want, err string }{
		{"hybrid", "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified", ""},
		{"unified", "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup", ""},
		{"escaped", "35 24 0:30 / /mnt/cg\\040v2 rw - cgroup2 none rw\n", "/mnt/cg v2", ""},
		{"container's own cgroup, its namespace's root", "35 24 0:30 / /sys/fs/cgroup/sub rw - cgroup2 cgroup2 rw\n", "", "only below the hierarchy's root"},
		{"the host's hierarchy mounted into a container", "35 24 0:30 / /sys/fs/cgroup/sub rw - cgroup2 cgroup2 rw\n36 24 0:30 /.. /host/cgroup rw - cgroup2 cgroup2 rw\n", "/host/cgroup", ""},
		{"v1 only", "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "", "no cgroup2 mount"},
	} {
		got, err := cgroup2Mount(strings.NewReader(tc.in), isRoot)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %q, %v; want %q, error containing %q", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// On this host: the mounted root is the root, and a cgroup below it is not.
func TestIsRootCgroup(t *testing.T) {
	root, err := CgroupRoot()
	if err != nil {
		t.Skip(err)
	}
	if !isRootCgroup(root) {
		t.Errorf("%s is not the root", root)
	}
	sub := filepath.Join(root, fmt.Sprintf("hostaccel-test-%d", os.Getpid()))
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Skip(err) // not root
	}
	defer os.Remove(sub)
	if isRootCgroup(sub) {
		t.Errorf("%s taken for the root", sub)
	}
}

func TestRender(t *testing.T) {
	p := netip.MustParsePrefix
	s := model.State{LocalPodCIDRs: []netip.Prefix{p("10.1.0.0/16"), p("fd00::/64")}, Exclude: []netip.Prefix{p("10.1.2.0/24"), p("10.0.0.0/8")}}
	if Render(s) != nil {
		t.Fatal("Render without local-pod-to-pod: want nil")
	}
	s.Classes = []model.Class{model.LocalPodToPod}
	got := Render(s).entries()
	want := map[netip.Prefix]uint32{
		p("10.1.0.0/16"): addrLocalPod | addrExclude, // inside an exclusion: excluded
		p("10.1.2.0/24"): addrLocalPod | addrExclude,
		p("10.0.0.0/8"):  addrExclude,
		p("fd00::/64"):   addrLocalPod,
	}
	if len(got) != len(want) {
		t.Fatalf("entries: %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("entries[%s] = %b, want %b", k, got[k], v)
		}
	}
}
