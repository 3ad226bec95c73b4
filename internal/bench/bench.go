package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hostaccel/hostaccel/internal/probe"
)

// Measure measures everything the options ask for: the variants this kernel supports here, and
// (--vm auto) the others inside the project's VM, which then runs every requested variant
// with its own default and direct link, so that its cells are compared among themselves.
func Measure(ctx context.Context, o Options, prog *Progress) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Command: o.Command, Commit: gitCommit(), Started: time.Now(), Target: PerPacketTarget}
	names := o.Variants
	if len(names) == 0 {
		names = DefaultNames()
	}
	caps := probe.Run(ctx)
	var lacking []string
	for _, n := range names {
		v, _ := Lookup(n)
		if len(v.Missing(caps)) > 0 {
			lacking = append(lacking, n)
		}
	}
	pktgenHere := o.Pktgen && PktgenAvailable(ctx) == nil
	useVM := !o.Here && (o.VM == VMAlways || o.VM == VMOnly || (o.VM == VMAuto && (len(lacking) > 0 || (o.Pktgen && !pktgenHere))))
	if !o.Here && o.VM == VMNever && len(lacking) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("--vm never: %s not measured (this kernel lacks what they need).", strings.Join(lacking, ", ")))
	}

	var errs []error
	hostOpts := o
	hostOpts.Variants = names
	hostOpts.Pktgen = pktgenHere
	if (len(hostOpts.Tests) > 0 || hostOpts.Pktgen) && o.measureHere() {
		r, err := RunHere(ctx, hostOpts, "host", prog)
		if r != nil {
			if o.Pktgen && !pktgenHere {
				r.PktgenSkipped = "this kernel has no pktgen"
			}
			rep.Runs = append(rep.Runs, r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("host: %w", err))
		}
	}
	if useVM && ctx.Err() == nil {
		var boots []*Run
		for b := 1; b <= max(o.VMBoots, 1) && ctx.Err() == nil; b++ {
			if o.VMBoots > 1 {
				prog.Note(fmt.Sprintf("VM boot %d/%d", b, o.VMBoots))
			}
			r, err := RunInVM(ctx, o, names, prog)
			if err != nil {
				errs = append(errs, err)
				rep.Notes = append(rep.Notes, fmt.Sprintf("The VM part failed (boot %d of %d): %s", b, max(o.VMBoots, 1), firstLines(err.Error(), 1)))
				continue
			}
			boots = append(boots, r)
		}
		if r := poolBoots(boots); r != nil {
			rep.Runs = append(rep.Runs, r)
		}
	}
	rep.Finished = time.Now()
	return rep, errors.Join(errs...)
}

// measureHere reports whether a run measures in this kernel (all but --vm only).
func (o Options) measureHere() bool { return o.Here || o.VM != VMOnly }

// gitCommit is the short commit of the repository in the working directory, if any.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Write saves the report as DIR/<date>-<commit>.{md,json,png} and returns the paths.
func (rep *Report) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := rep.Started.Format("2006-01-02")
	if rep.Commit != "" {
		base += "-" + rep.Commit
	}
	js, err := rep.JSON()
	if err != nil {
		return nil, err
	}
	img, err := rep.Chart()
	if err != nil {
		return nil, err
	}
	md := rep.Markdown()
	md = strings.Replace(md, "\n## ", fmt.Sprintf("\n![chart](%s.png)\n\nEvery sample: [%s.json](%s.json).\n\n## ", base, base, base), 1)
	var paths []string
	for _, f := range []struct {
		ext  string
		data []byte
	}{{".md", []byte(md)}, {".json", js}, {".png", img}} {
		p := filepath.Join(dir, base+f.ext)
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return slices.Clip(paths), nil
}
