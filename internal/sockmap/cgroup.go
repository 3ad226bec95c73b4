package sockmap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MountInfo is where CgroupRoot looks for the cgroup v2 mount.
const MountInfo = "/proc/self/mountinfo"

// CgroupRoot returns a mount point of the cgroup v2 hierarchy's root (the unified hierarchy:
// at /sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones), from
// /proc/self/mountinfo. A sock_ops program attached there sees every TCP socket of the node.
func CgroupRoot() (string, error) {
	f, err := os.Open(MountInfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return cgroup2Mount(f, isRootCgroup)
}

// isRootCgroup reports whether dir is the root cgroup of its hierarchy: the only one without
// cgroup.events. Mountinfo cannot tell: it shows a mount's root relative to the reader's
// cgroup namespace, so a container's own cgroup mounted in its private namespace (what runc
// gives a Pod on a cgroup v2 node) reads "/", and the host's hierarchy mounted into it reads
// "/..".
func isRootCgroup(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "cgroup.events"))
	return errors.Is(err, fs.ErrNotExist)
}

// BPFFS returns the mount point of the BPF filesystem (normally /sys/fs/bpf), where Apply
// pins the sockhash: the kernel releases a sockmap's sk_msg program when the last file
// descriptor or pin of the map goes away, whatever programs still use the map.
func BPFFS() (string, error) {
	f, err := os.Open(MountInfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ms, err := mounts(f)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.fsType == "bpf" {
			return m.point, nil
		}
	}
	return "", errors.New(MountInfo + ": the BPF filesystem is not mounted (mount -t bpf bpf /sys/fs/bpf; in a container, mount the host's /sys/fs/bpf)")
}

// cgroup2Mount returns the first cgroup2 mount point that isRoot says is the hierarchy's
// root (a sub-cgroup's sock_ops sees only the sockets of its processes: a container's own).
func cgroup2Mount(r io.Reader, isRoot func(dir string) bool) (string, error) {
	ms, err := mounts(r)
	if err != nil {
		return "", err
	}
	var sub string
	for _, m := range ms {
		if m.fsType != "cgroup2" {
			continue
		}
		if isRoot(m.point) {
			return m.point, nil
		}
		if sub == "" {
			sub = m.point
		}
	}
	if sub != "" {
		return "", fmt.Errorf("%s: cgroup2 is mounted only below the hierarchy's root (%s is a sub-cgroup, such as a container's own in its cgroup namespace): mount the host's /sys/fs/cgroup into the container, or run hostaccel in the host's cgroup namespace", MountInfo, sub)
	}
	return "", errors.New(MountInfo + ": no cgroup2 mount (mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// mount is one line of mountinfo, e.g.
// 41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
type mount struct{ root, point, fsType string }

// mounts reads mountinfo's lines (malformed ones skipped), paths unescaped.
func mounts(r io.Reader) ([]mount, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var ms []mount
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			continue
		}
		ms = append(ms, mount{root: unescape(f[3]), point: unescape(f[4]), fsType: g[0]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", MountInfo, err)
	}
	return ms, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + c - '0'
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
