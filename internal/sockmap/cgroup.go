package sockmap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// MountInfo is where CgroupRoot looks for the cgroup v2 mount.
const MountInfo = "/proc/self/mountinfo"

// CgroupRoot returns the mount point of the cgroup v2 hierarchy (the unified hierarchy: at
// /sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones), from
// /proc/self/mountinfo. A sock_ops program attached there sees every TCP socket of the node.
func CgroupRoot() (string, error) {
	f, err := os.Open(MountInfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return cgroup2Mount(f)
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
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); ok && len(f) >= 5 && len(g) >= 1 && g[0] == "bpf" {
			return unescape(f[4]), nil
		}
	}
	return "", errors.New(MountInfo + ": the BPF filesystem is not mounted (mount -t bpf bpf /sys/fs/bpf; in a container, mount the host's /sys/fs/bpf)")
}

// cgroup2Mount returns the first cgroup2 mount point whose root is the hierarchy's root ("/":
// a container's view of a sub-cgroup would see only its own sockets).
func cgroup2Mount(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var sub string
	for sc.Scan() {
		// 41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || g[0] != "cgroup2" {
			continue
		}
		mnt := unescape(f[4])
		if f[3] == "/" {
			return mnt, nil
		}
		if sub == "" {
			sub = mnt + " (root " + unescape(f[3]) + ")"
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", MountInfo, err)
	}
	if sub != "" {
		return "", fmt.Errorf("%s: cgroup2 is mounted only below the hierarchy's root (%s): run hostaccel in the host's cgroup namespace", MountInfo, sub)
	}
	return "", errors.New(MountInfo + ": no cgroup2 mount (mount -t cgroup2 none /sys/fs/cgroup/unified)")
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
