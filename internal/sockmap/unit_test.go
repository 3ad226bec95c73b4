package sockmap

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/model"
)

func TestCgroup2Mount(t *testing.T) {
	for _, tc := range []struct{ name, in, want, err string }{
		{"hybrid", "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified", ""},
		{"unified", "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup", ""},
		{"escaped", "35 24 0:30 / /mnt/cg\\040v2 rw - cgroup2 none rw\n", "/mnt/cg v2", ""},
		{"container view", "35 24 0:30 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "", "only below the hierarchy's root"},
		{"v1 only", "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "", "no cgroup2 mount"},
	} {
		got, err := cgroup2Mount(strings.NewReader(tc.in))
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %q, %v; want %q, error containing %q", tc.name, got, err, tc.want, tc.err)
		}
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
