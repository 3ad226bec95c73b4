package nldump

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

// fakeDump answers ErrDumpInterrupted (with a partial list, as netlink does) for its first
// interrupted calls, then err with the whole list; it counts its calls.
type fakeDump struct {
	interrupted int
	err         error
	calls       int
}

func (f *fakeDump) dump() ([]string, error) {
	f.calls++
	if f.calls <= f.interrupted {
		return []string{"partial"}, fmt.Errorf("link dump: %w", netlink.ErrDumpInterrupted)
	}
	return []string{"a", "b"}, f.err
}

// A dump the kernel marks interrupted is read again: during Pod churn address and
// neighbour dumps were, and each failed a tc apply or a load balancer sync (a review: one tc
// apply in 300 with 150 veths churning). Retry gives the first answer that is not
// ErrDumpInterrupted, up to Tries dumps; after that, the last interrupted one.
func TestRetryReadsInterruptedDumpsAgain(t *testing.T) {
	refused := syscall.EPERM
	for _, c := range []struct {
		interrupted int
		err         error
		want        []string
		wantErr     error
		wantCalls   int
	}{
		{interrupted: 0, want: []string{"a", "b"}, wantCalls: 1},
		{interrupted: 1, want: []string{"a", "b"}, wantCalls: 2},
		{interrupted: 3, want: []string{"a", "b"}, wantCalls: 4},
		{interrupted: Tries - 1, want: []string{"a", "b"}, wantCalls: Tries},
		{interrupted: Tries, want: []string{"partial"}, wantErr: netlink.ErrDumpInterrupted, wantCalls: Tries},
		{interrupted: 100, want: []string{"partial"}, wantErr: netlink.ErrDumpInterrupted, wantCalls: Tries},
		{interrupted: 0, err: refused, want: []string{"a", "b"}, wantErr: refused, wantCalls: 1}, // other errors: no second dump
		{interrupted: 2, err: refused, want: []string{"a", "b"}, wantErr: refused, wantCalls: 3},
	} {
		f := &fakeDump{interrupted: c.interrupted, err: c.err}
		got, err := Retry(f.dump)
		if fmt.Sprint(got) != fmt.Sprint(c.want) || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) || f.calls != c.wantCalls {
			t.Errorf("interrupted %d times, then %v: Retry = %v, %v after %d dumps; want %v, %v after %d",
				c.interrupted, c.err, got, err, f.calls, c.want, c.wantErr, c.wantCalls)
		}
	}
}
