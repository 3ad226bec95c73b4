package lb

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/model"
)

// Overlay is what the API changed, kept in the agent's state file: services added or
// replaced through the API (a service changed through the API is kept whole, and shadows the
// config file's service of the same name), and the names of config services deleted through
// the API. `hostaccel lb reset NAME` drops a service's override.
type Overlay struct {
	Services []Service `json:"services,omitempty"`
	Deleted  []string  `json:"deleted,omitempty"`
}

// Merge returns the services in effect: the config's, replaced or deleted by the overlay,
// then the overlay's own.
func Merge(base []Service, o Overlay) []Service {
	var out []Service
	if n := len(base) + len(o.Services); n > 0 {
		out = make([]Service, 0, n)
	}
	for _, s := range base {
		if slices.Contains(o.Deleted, s.Name) {
			continue
		}
		if i := o.index(s.Name); i >= 0 {
			s = o.Services[i]
		}
		out = append(out, s)
	}
	for _, s := range o.Services {
		if !slices.ContainsFunc(base, func(b Service) bool { return b.Name == s.Name }) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (o *Overlay) index(name string) int {
	return slices.IndexFunc(o.Services, func(s Service) bool { return s.Name == name })
}

// put adds or replaces a service.
func (o *Overlay) put(s Service) {
	o.Deleted = slices.DeleteFunc(o.Deleted, func(n string) bool { return n == s.Name })
	if i := o.index(s.Name); i >= 0 {
		o.Services[i] = s
	} else {
		o.Services = append(o.Services, s)
	}
}

// remove deletes a service; inConfig: the config file has it, so the deletion is recorded.
func (o *Overlay) remove(name string, inConfig bool) {
	o.reset(name)
	if inConfig {
		o.Deleted = append(o.Deleted, name)
	}
}

// reset forgets whatever the API did to a service.
func (o *Overlay) reset(name string) {
	o.Services = slices.DeleteFunc(o.Services, func(s Service) bool { return s.Name == name })
	o.Deleted = slices.DeleteFunc(o.Deleted, func(n string) bool { return n == name })
}

func (o Overlay) clone() Overlay {
	return Overlay{Services: slices.Clone(o.Services), Deleted: slices.Clone(o.Deleted)}
}

// LoadOverlay reads the state file; a missing file is an empty overlay.
func LoadOverlay(path string) (Overlay, error) {
	var o Overlay
	b, err := model.ReadConfigFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return o, nil
	}
	if err != nil {
		return o, err
	}
	if err := model.UnmarshalStrict(b, &o); err != nil {
		return o, fmt.Errorf("%s: %w", path, err)
	}
	return o, nil
}

const stateHeader = "# hostaccel load balancer: services changed through the API (hostaccel lb ...).\n" +
	"# Written by the agent; they override the config file's services of the same name.\n"

// Save writes the state file atomically and durably: an API change is answered once it is
// saved, so a crash after leaves the new file (never an empty one).
func (o Overlay) Save(path string) error {
	b, err := yaml.Marshal(o)
	if err != nil {
		return err
	}
	return replaceFile(path, append([]byte(stateHeader), b...), true)
}

// replaceFile replaces the file at path with b (mode 0600), creating its directory: b goes to
// a file of its own, renamed over path, so a reader sees the old file or the new one. durable
// also syncs the file before the rename and the directory after, so that a crash keeps the
// new one.
func replaceFile(path string, b []byte, durable bool) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp") // (mode 0600)
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // (gone once renamed)
	_, err = f.Write(b)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil || !durable {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		return err
	}
	return nil
}

// DecodeService decodes one service (YAML or JSON) strictly.
func DecodeService(b []byte) (Service, error) {
	var s Service
	if err := model.UnmarshalStrict(b, &s); err != nil {
		return s, fmt.Errorf("service: %w", err)
	}
	return s, nil
}

// DecodeBackend decodes one backend (YAML or JSON) strictly.
func DecodeBackend(b []byte) (Backend, error) {
	var be Backend
	if err := model.UnmarshalStrict(b, &be); err != nil {
		return be, fmt.Errorf("backend: %w", err)
	}
	return be, nil
}
