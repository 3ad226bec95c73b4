package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"unicode/utf8"
)

// ParseAddr parses an IP address as configs write it. An IPv6 zone ("fe80::1%eth0") is an
// error: it names an interface of one host, and nftables sets and tc maps have no room for
// it (dropping it silently would install a different address than the one written).
func ParseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s is not a valid IP address", Quote(s))
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s has an IPv6 zone (%%%s); zones are not allowed", Quote(s), Cut(a.Zone()))
	}
	return a, nil
}

// ParsePrefix parses a CIDR, or a bare address as a host prefix (10.0.0.1 is 10.0.0.1/32).
// Zones and host bits are errors.
func ParsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s) // "fe80::%eth0/64" parses as fe80:: with zone "eth0/64"
		switch {
		case aerr == nil && a.Zone() != "":
			return netip.Prefix{}, fmt.Errorf("%s has an IPv6 zone (%%%s); zones are not allowed", Quote(s), Cut(a.Zone()))
		case aerr == nil:
			return netip.PrefixFrom(a, a.BitLen()), nil
		}
		return netip.Prefix{}, fmt.Errorf("%s is not a valid CIDR", Quote(s))
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%s has host bits set (did you mean %s?)", Quote(s), p.Masked())
	}
	return p, nil
}

// MaxQuoted is how much of a value error messages quote: a config value can be megabytes.
const MaxQuoted = 64

// Quote is strconv.Quote for error messages: a value longer than MaxQuoted bytes is cut, and
// says how long it was: "aaaa"…(52428800 bytes).
func Quote(s string) string {
	n := cutAt(s)
	if n == len(s) {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s…(%d bytes)", strconv.Quote(s[:n]), len(s))
}

// Cut is Quote without the quotes: aaaa…(52428800 bytes).
func Cut(s string) string {
	n := cutAt(s)
	if n == len(s) {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:n], len(s))
}

// cutAt is where Quote and Cut cut s: at MaxQuoted bytes, not inside a UTF-8 sequence.
func cutAt(s string) int {
	if len(s) <= MaxQuoted {
		return len(s)
	}
	n := MaxQuoted
	for n > MaxQuoted-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
