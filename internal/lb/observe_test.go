package lb

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A reading nothing waits for runs nft at nice 19; any other at the agent's own priority.
func TestBackgroundReadIsNiced(t *testing.T) {
	dir := t.TempDir()
	// A stand-in nft that prints its nice value (field 19 of /proc/PID/stat) after NFTList
	// had the time to set it.
	script := "#!/bin/sh\nsleep 0.3\nawk '{print $19}' /proc/$$/stat\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	own, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	ownNice := strings.Fields(string(own[strings.LastIndexByte(string(own), ')')+2:]))[16]
	for _, tc := range []struct {
		ctx  context.Context
		want string
	}{{context.Background(), ownNice}, {background(context.Background()), "19"}} {
		out, err := NFTList(tc.ctx, "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("nft ran at nice %s, want %s", got, tc.want)
		}
	}
}
