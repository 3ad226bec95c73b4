package model

import (
	"fmt"
	"io"
	"os"
)

// MaxConfigSize is the largest config (or state, service or key) file hostaccel reads: a
// config is kilobytes, and `apply -f /dev/zero` must fail rather than fill the memory.
const MaxConfigSize = 16 << 20

// ReadConfigFile reads a file of at most MaxConfigSize bytes.
func ReadConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory", Cut(path))
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxConfigSize {
		return nil, fmt.Errorf("%s is larger than 16 MiB, the limit for a config file", Cut(path))
	}
	return b, nil
}
