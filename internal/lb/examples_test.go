package lb_test

import (
	"path/filepath"
	"testing"

	"github.com/hostaccel/hostaccel/internal/config"
	"github.com/hostaccel/hostaccel/internal/lb"
)

// The examples are valid configs and render.
func TestExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/lb-*.yaml")
	if len(files) < 3 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		c, err := config.Load(f)
		if err != nil {
			t.Error(err)
			continue
		}
		svcs := c.LoadBalancer.Services
		if _, err := lb.Render(lb.Resolve(svcs, nil, lb.OfflineEnv(svcs, lb.Env{}))).Dump(); err != nil || len(svcs) == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
