package probe

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Capabilities hostaccel needs; without them the kernel answers EPERM, which must not be
// mistaken for a missing kernel feature.
const (
	CapNetAdmin = "CAP_NET_ADMIN"
	CapSysAdmin = "CAP_SYS_ADMIN"
)

// Parts of hostaccel that need capabilities (PrivilegeError.Part).
const (
	PartFlowtable = "flowtable"
	PartTC        = "tc"
	PartLB        = "lb"
	PartNFT       = "nftables" // nft itself: the flowtable and the load balancer
)

// Needs lists the least capabilities each part runs with, as measured (docs/deploy.md):
// nftables (the flowtable, the load balancer) needs CAP_NET_ADMIN. The tc datapath needs
// CAP_SYS_ADMIN besides: CAP_BPF alone loads no program (the verifier then rejects the
// program's reads of its stack), and with CAP_BPF and CAP_PERFMON the program loads but no
// later run can find it again by ID (BPF_PROG_GET_FD_BY_ID needs CAP_SYS_ADMIN), which
// status, cleanup and every agent sync do; the tc probes also need a throwaway network
// namespace (unshare, CAP_SYS_ADMIN).
var Needs = map[string][]string{
	PartFlowtable: {CapNetAdmin},
	PartLB:        {CapNetAdmin},
	PartTC:        {CapNetAdmin, CapSysAdmin},
	PartNFT:       {CapNetAdmin},
}

var capBits = map[string]int{CapNetAdmin: unix.CAP_NET_ADMIN, CapSysAdmin: unix.CAP_SYS_ADMIN}

// missingCaps returns the capabilities hostaccel needs that the calling thread's effective
// set lacks (nil when they cannot be read).
func missingCaps() []string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil
	}
	var out []string
	for _, name := range []string{CapNetAdmin, CapSysAdmin} {
		bit := capBits[name]
		if data[bit/32].Effective&(1<<(bit%32)) == 0 {
			out = append(out, name)
		}
	}
	return out
}

// PrivilegeError says that a part of hostaccel cannot run because this process lacks
// capabilities, whatever the kernel can do.
type PrivilegeError struct {
	Part    string
	Missing []string
}

func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("%s needs %s; this process lacks %s (run as root, or add the capabilities to the container's securityContext: docs/deploy.md)",
		partName(e.Part), and(Needs[e.Part]), and(e.Missing))
}

func partName(part string) string {
	switch part {
	case PartLB:
		return "the load balancer"
	case PartNFT:
		return "nftables (the flowtable datapath, the load balancer)"
	}
	return "the " + part + " datapath"
}

func and(s []string) string { return strings.Join(s, " and ") }

// Privilege returns a *PrivilegeError when the process that probed lacks a capability part
// needs, else nil.
func (r Result) Privilege(part string) error { return privilege(part, r.MissingCapabilities) }

// CheckPrivilege is Privilege for the calling process as it is now, without probing.
func CheckPrivilege(part string) error { return privilege(part, missingCaps()) }

func privilege(part string, lacks []string) error {
	var missing []string
	for _, c := range Needs[part] {
		for _, m := range lacks {
			if c == m {
				missing = append(missing, c)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &PrivilegeError{Part: part, Missing: missing}
}

// permissionHint says why the kernel refused a probe: the capabilities this process lacks,
// or, when it has them all, what else forbids it.
func permissionHint() string {
	missing := missingCaps()
	if len(missing) == 0 {
		return fmt.Sprintf("permission denied although this process has %s and %s: a seccomp profile or an LSM (AppArmor, SELinux) may forbid it", CapNetAdmin, CapSysAdmin)
	}
	return fmt.Sprintf("this process lacks %s (the tc datapath needs %s, the flowtable and the load balancer %s)",
		and(missing), and(Needs[PartTC]), and(Needs[PartLB]))
}
