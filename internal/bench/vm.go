package bench

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FindVMTest returns the directory holding run-in-vm.sh: dir if given, else vmtest/ in the
// working directory, the executable's directory, or one of their parents.
func FindVMTest(dir string) (string, error) {
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "run-in-vm.sh")); err != nil {
			return "", fmt.Errorf("vmtest: %w", err)
		}
		return dir, nil
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
	}
	for _, s := range starts {
		for d := s; ; d = filepath.Dir(d) {
			p := filepath.Join(d, "vmtest", "run-in-vm.sh")
			if _, err := os.Stat(p); err == nil {
				return filepath.Dir(p), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("vmtest/run-in-vm.sh not found (run from the hostaccel repository, or pass --vmtest DIR)")
}

// dynamic reports whether the ELF file at path needs a dynamic loader.
func dynamic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// vmPhaseSpread is the VM's Options.PhaseSpread: as given, else 1 s under icount (the
// kernel's once-a-second work), else none.
func (o Options) vmPhaseSpread() time.Duration {
	switch {
	case o.PhaseSpread > 0:
		return o.PhaseSpread
	case o.VMICount:
		return time.Second
	}
	return 0
}

// GuestArgs is the `hostaccel bench` command line the VM runs: the same measurements, in
// the guest's kernel, with the VM's duration and pinning.
func GuestArgs(o Options, variants []string, jsonOut string) []string {
	args := []string{"bench", "--here", "--env", "vm", "--variants", strings.Join(variants, ",")}
	if len(o.Tests) > 0 {
		args = append(args, "--tests", strings.Join(o.Tests, ","), "--traffic", strings.ReplaceAll(joinTraffic(o.Traffic), " ", ""))
	} else {
		args = append(args, "--tests", "")
	}
	pin := "auto"
	if p, _ := ParsePin(o.Pin, 1<<10); !p.Enabled {
		pin = "none"
	}
	reps := o.Reps
	if o.VMReps > 0 {
		reps = o.VMReps
	}
	return append(args,
		"--reps", strconv.Itoa(reps),
		"--duration", o.VMDuration.String(),
		"--rules", strconv.Itoa(o.Rules),
		"--pin", pin,
		"--nodes", strconv.Itoa(o.Nodes),
		"--services", strconv.Itoa(o.Services),
		"--pktgen="+strconv.FormatBool(o.Pktgen),
		"--pktgen-duration", o.PktgenDuration.String(),
		"--pktgen-size", strconv.Itoa(o.PktgenSize),
		"--pktgen-directions", joinDirections(o.PktgenDirections),
		"--raise-conntrack-max",
		"--phase-spread", o.vmPhaseSpread().String(),
		"--json-out", jsonOut)
}

// vmTimeout estimates how long the VM part may take (twice the expected time plus boot).
func vmTimeout(o Options, variants int) time.Duration {
	if o.VMTimeout > 0 {
		return o.VMTimeout
	}
	reps := o.Reps
	if o.VMReps > 0 {
		reps = o.VMReps
	}
	cells := variants * len(o.Tests) * len(o.Traffic) * reps
	per := 8*o.VMDuration + 6*time.Second // TCG runs the guest clock slower than real time
	pk := 0 * time.Second
	if o.Pktgen {
		pk = time.Duration(variants*reps*max(len(o.PktgenDirections), 1)) * (40*o.PktgenDuration + 20*time.Second)
	}
	return 2*(time.Duration(cells)*per+pk) + 5*time.Minute
}

// VMExtraModules are kernel modules the bench needs in the VM beyond vmtest's base set
// (none now: the base set has nft_reject_ipv4 and nft_objref).
const VMExtraModules = ""

var progressLine = regexp.MustCompile(`^\[\s*\d+/\d+\] `)

// RunInVM runs the variants in the project's VM (Debian cloud kernel under qemu TCG) and
// returns the guest's Run. The guest writes its JSON to a second serial port, so kernel
// messages on the console cannot corrupt it; its progress lines are passed on to prog.
func RunInVM(ctx context.Context, o Options, variants []string, prog *Progress) (*Run, error) {
	dir, err := FindVMTest(o.VMTest)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if dynamic(exe) {
		prog.Note("warning: " + exe + " is dynamically linked; the VM has glibc but static builds are safer (CGO_ENABLED=0)")
	}
	tmp, err := os.MkdirTemp("", "hostaccel-bench-vm.")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	jsonPath := filepath.Join(tmp, "run.json")
	timeout := vmTimeout(o, len(variants))
	args := []string{"-q", "-t", strconv.Itoa(int(timeout.Seconds())), "-m", "1G", "-f", exe + ":/vmtest/hostaccel"}
	if o.VMICount {
		args = append(args, "-i")
	}
	args = append(args, "--", "/vmtest/hostaccel")
	args = append(args, GuestArgs(o, variants, "/dev/ttyS1")...)
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "run-in-vm.sh"), args...)
	// The guest writes its JSON to a second serial port. Its initramfs is the project's plus
	// the modules a kube-proxy-like ruleset needs that the base one leaves out (reject in an
	// ip table), kept in a file of its own so that other VM users' base is not rebuilt.
	cmd.Env = append(os.Environ(), "VMTEST_QEMU_ARGS=-serial file:"+jsonPath,
		"VMTEST_BASE="+filepath.Join(filepath.Dir(dir), ".cache", "vm-bench.cpio"),
		"VMTEST_EXTRA_MODS="+strings.TrimSpace(os.Getenv("VMTEST_EXTRA_MODS")+" "+VMExtraModules))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // its trap stops qemu
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr := &tail{n: 40}
	cmd.Stderr = stderr
	prog.Note(fmt.Sprintf("VM: booting the Debian cloud kernel under qemu TCG%s (timeout %s): %s",
		map[bool]string{true: " with -icount", false: ""}[o.VMICount], timeout.Round(time.Minute), strings.Join(variants, ", ")))
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	log := &tail{n: 40}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if progressLine.MatchString(line) {
			prog.Note("VM " + line)
			continue
		}
		log.add(line)
	}
	werr := cmd.Wait()
	data, rerr := os.ReadFile(jsonPath)
	if werr != nil || rerr != nil || len(data) == 0 {
		return nil, fmt.Errorf("VM run failed: %v; guest output:\n%s\n%s", errors.Join(werr, rerr), log, stderr)
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("VM run: reading its JSON (%d bytes): %w; guest output:\n%s", len(data), err, log)
	}
	mode := "TCG"
	if o.VMICount {
		mode = "TCG, icount"
	}
	r.Label = fmt.Sprintf("VM (%s; kernel %s)", mode, r.Machine.Kernel)
	r.Machine.Qemu = CollectMachine().Qemu
	r.Machine.Hypervisor = "qemu " + mode + " on the host"
	return &r, nil
}

// tail keeps the last n lines written to it.
type tail struct {
	n     int
	lines []string
	part  string
}

func (t *tail) add(line string) {
	t.lines = append(t.lines, line)
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

func (t *tail) Write(p []byte) (int, error) {
	s := t.part + string(p)
	lines := strings.Split(s, "\n")
	t.part = lines[len(lines)-1]
	for _, l := range lines[:len(lines)-1] {
		t.add(l)
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.Join(append(t.lines, t.part), "\n") }

// poolBoots pools the runs of several VM boots into one: the later boots' samples are
// numbered on from the earlier ones' repetitions and say their boot, and the cells are
// summarized again over all of them. One run is returned as it is; none gives nil.
func poolBoots(runs []*Run) *Run {
	if len(runs) <= 1 {
		if len(runs) == 1 {
			return runs[0]
		}
		return nil
	}
	out := *runs[0]
	out.Samples, out.Pktgen, out.Reps, out.Boots = nil, nil, 0, len(runs)
	for i, r := range runs {
		for _, s := range r.Samples {
			s.Rep += out.Reps
			s.Boot = i + 1
			out.Samples = append(out.Samples, s)
		}
		for _, s := range r.Pktgen {
			s.Rep += out.Reps
			out.Pktgen = append(out.Pktgen, s)
		}
		out.Reps += r.Reps
		out.Finished = r.Finished
	}
	out.Notes = append(slices.Clone(out.Notes), fmt.Sprintf("%d boots of the VM, %d repetitions each, pooled: a boot draws its own hash seeds and ports, which icount does not make repeat.", len(runs), runs[0].Reps))
	out.summarize()
	return &out
}
