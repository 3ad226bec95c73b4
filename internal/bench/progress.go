package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress prints one line per finished step, or, on a terminal, keeps one status line up
// to date. A nil *Progress prints nothing.
type Progress struct {
	W   io.Writer
	TTY bool

	mu     sync.Mutex
	total  int
	done   int
	start  time.Time
	status string
}

// Add announces n more steps.
func (p *Progress) Add(n int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.start.IsZero() {
		p.start = time.Now()
	}
	p.total += n
}

// Status says what runs now.
func (p *Progress) Status(s string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = s
	if p.TTY {
		p.line(s + " ...")
	}
}

// Done finishes one step with its result.
func (p *Progress) Done(result string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.line(result)
	if !p.TTY {
		fmt.Fprintln(p.W)
	}
}

// Note prints a line of its own (above the status line on a terminal).
func (p *Progress) Note(s string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.TTY {
		fmt.Fprintf(p.W, "\r\033[K%s\n", s)
		return
	}
	fmt.Fprintln(p.W, s)
}

// Finish ends the status line.
func (p *Progress) Finish() {
	if p == nil || !p.TTY {
		return
	}
	fmt.Fprintln(p.W)
}

func (p *Progress) line(s string) {
	eta := ""
	if p.done > 0 && p.total > p.done {
		left := time.Since(p.start) / time.Duration(p.done) * time.Duration(p.total-p.done)
		eta = fmt.Sprintf(" (eta %s)", left.Round(time.Second))
	}
	width := len(fmt.Sprint(p.total))
	text := fmt.Sprintf("[%*d/%d] %s%s", width, p.done, p.total, s, eta)
	if p.TTY {
		fmt.Fprintf(p.W, "\r\033[K%s", strings.ReplaceAll(text, "\n", " "))
		return
	}
	fmt.Fprint(p.W, text)
}
