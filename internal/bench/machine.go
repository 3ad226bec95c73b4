package bench

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine describes where a run happened.
type Machine struct {
	CPU           string `json:"cpu"`
	CPUs          int    `json:"cpus"`
	MemoryMiB     int    `json:"memoryMiB"`
	Kernel        string `json:"kernel"`
	KernelVersion string `json:"kernelVersion"`
	OS            string `json:"os,omitempty"`
	Hypervisor    string `json:"hypervisor,omitempty"`
	Netperf       string `json:"netperf,omitempty"`
	Nft           string `json:"nft,omitempty"`
	Qemu          string `json:"qemu,omitempty"`
	Go            string `json:"go"`
}

// CollectMachine reads the machine's description; what cannot be read stays empty.
func CollectMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
		m.KernelVersion = unix.ByteSliceToString(u.Version[:])
	}
	m.CPU = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.Atoi(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0]); err == nil {
		m.MemoryMiB = kb / 1024
	}
	if strings.Contains(procField("/proc/cpuinfo", "flags"), "hypervisor") {
		m.Hypervisor = "yes"
		if v, err := os.ReadFile("/sys/class/dmi/id/sys_vendor"); err == nil {
			m.Hypervisor = strings.TrimSpace(string(v))
		}
	}
	if data, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if out, err := runHost("netperf", "-V"); err == nil {
		m.Netperf = strings.TrimSpace(out)
	}
	if out, err := runHost("nft", "--version"); err == nil {
		m.Nft = strings.TrimSpace(out)
	}
	if out, err := runHost("qemu-system-x86_64", "--version"); err == nil {
		m.Qemu = strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
	}
	return m
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// runHost runs a command in this process's namespaces.
func runHost(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
