package model

import (
	"strings"
	"testing"
)

func TestParseAddrAndPrefix(t *testing.T) {
	for _, tc := range []struct{ in, addr, prefix string }{
		{"10.0.0.1", "10.0.0.1", "10.0.0.1/32"},
		{"fd00::1", "fd00::1", "fd00::1/128"},
		{"10.0.0.0/8", `"10.0.0.0/8" is not a valid IP address`, "10.0.0.0/8"},
		{"10.0.0.1/8", `"10.0.0.1/8" is not a valid IP address`, `"10.0.0.1/8" has host bits set (did you mean 10.0.0.0/8?)`},
		{"fe80::1%eth0", `"fe80::1%eth0" has an IPv6 zone (%eth0); zones are not allowed`, `"fe80::1%eth0" has an IPv6 zone (%eth0); zones are not allowed`},
		{"fe80::%eth0/64", `"fe80::%eth0/64" has an IPv6 zone (%eth0/64)`, `"fe80::%eth0/64" has an IPv6 zone (%eth0/64)`},
		{"10.0.0.1%eth0", `"10.0.0.1%eth0" is not a valid IP address`, `"10.0.0.1%eth0" is not a valid CIDR`},
		{"", `"" is not a valid IP address`, `"" is not a valid CIDR`},
	} {
		s := func(v any, err error) string {
			if err != nil {
				return err.Error()
			}
			return v.(interface{ String() string }).String()
		}
		a, err := ParseAddr(tc.in)
		if got := s(a, err); !strings.HasPrefix(got, tc.addr) {
			t.Errorf("ParseAddr(%q) = %s, want %s", tc.in, got, tc.addr)
		}
		p, err := ParsePrefix(tc.in)
		if got := s(p, err); !strings.HasPrefix(got, tc.prefix) {
			t.Errorf("ParsePrefix(%q) = %s, want %s", tc.in, got, tc.prefix)
		}
	}
}

func TestQuoteCutsLongValues(t *testing.T) {
	if got := Quote("eth0"); got != `"eth0"` {
		t.Errorf("short: %s", got)
	}
	long := strings.Repeat("a", 50<<20)
	if got, want := Quote(long), `"`+strings.Repeat("a", MaxQuoted)+`"…(52428800 bytes)`; got != want {
		t.Errorf("long: %.100s", got)
	}
	if got, want := Cut(long), strings.Repeat("a", MaxQuoted)+"…(52428800 bytes)"; got != want {
		t.Errorf("cut: %.100s", got)
	}
	// A multi-byte character across the limit is not split.
	s := strings.Repeat("a", MaxQuoted-1) + "€" + "tail"
	if got, want := Quote(s), `"`+strings.Repeat("a", MaxQuoted-1)+`"…(70 bytes)`; got != want {
		t.Errorf("utf-8: %s, want %s", got, want)
	}
}
