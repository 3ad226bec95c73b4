package testbed

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Command returns the command "ip netns exec <ns> args...", killed when ctx
// is done.
func (n *NS) Command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, args...)...)
}

// Output runs args inside the namespace with stdin (nil for none) and returns
// their combined output. The error names the namespace and the command and
// includes the output.
func (n *NS) Output(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := n.Command(ctx, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Proc is a process started in a namespace by Start.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs args inside the namespace, in a process group of their own,
// until Close (of the Proc or of n) kills the group. Their output is
// discarded.
func (n *NS) Start(args ...string) (*Proc, error) {
	cmd := n.Command(context.Background(), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", n.Name, strings.Join(args, " "), err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	if err := n.track(p); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Close kills the process group and waits up to 5 s for the process to exit.
// It is safe to call more than once.
func (p *Proc) Close() error {
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("process %d did not exit", p.PID())
	}
}
