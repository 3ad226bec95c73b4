package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadConfigFileLimit(t *testing.T) {
	// /dev/zero never ends: it used to grow the process to 1.5 GiB until the kernel killed it.
	if _, err := ReadConfigFile("/dev/zero"); err == nil || err.Error() != "/dev/zero is larger than 16 MiB, the limit for a config file" {
		t.Errorf("/dev/zero: %v", err)
	}
	dir := t.TempDir()
	if _, err := ReadConfigFile(dir); err == nil || err.Error() != dir+" is a directory" {
		t.Errorf("directory: %v", err)
	}
	f := filepath.Join(dir, "c.yaml")
	os.WriteFile(f, []byte(strings.Repeat("#", MaxConfigSize)), 0o600)
	if b, err := ReadConfigFile(f); err != nil || len(b) != MaxConfigSize {
		t.Errorf("exactly the limit: %d bytes, %v", len(b), err)
	}
	os.WriteFile(f, []byte(strings.Repeat("#", MaxConfigSize+1)), 0o600)
	if _, err := ReadConfigFile(f); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") {
		t.Errorf("one byte over: %v", err)
	}
}
