package testbed

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// Namespaces lists the network namespaces whose names start with prefix
// (`ip netns list`), failing tb if they cannot be listed.
func Namespaces(tb testing.TB, prefix string) []string {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		tb.Fatalf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names
}

// RootLinks lists the names of the links in the root namespace, failing tb
// if they cannot be listed. Take it before building, for CheckNoLeaks.
func RootLinks(tb testing.TB) []string {
	tb.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// CheckNoLeaks fails tb (without stopping it) for each namespace whose name
// starts with prefix and for each link in the root namespace that is not
// among linksBefore (as RootLinks returned it before the build).
func CheckNoLeaks(tb testing.TB, prefix string, linksBefore []string) {
	tb.Helper()
	if ns := Namespaces(tb, prefix); len(ns) > 0 {
		tb.Errorf("namespaces left: %v", ns)
	}
	for _, l := range RootLinks(tb) {
		if !slices.Contains(linksBefore, l) {
			tb.Errorf("link %q left in the root namespace", l)
		}
	}
}
