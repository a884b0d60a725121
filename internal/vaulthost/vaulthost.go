// Package vaulthost holds the vault's host rules: the one normalization of
// DNS hostnames used both where a secret is bound to hosts (the vault) and
// where a request's destination is matched against them (the vault's
// release and the intern daemon's http_request tool, which follows
// redirects and must tell the bound host from any other).
package vaulthost

import (
	"errors"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// MaxHostName is the longest DNS name, in characters, without its trailing
// dot (RFC 1035: 255 octets on the wire). The spec's field bound of 254
// characters is this plus the one trailing dot an entry may carry.
const MaxHostName = 253

// maxLabel is the longest DNS label (RFC 1035).
const maxLabel = 63

// NormalizeHost returns the canonical form of an exact DNS hostname, the
// form the vault stores and matches on: ASCII, lowercase, without a trailing
// dot, internationalized labels as A-labels (xn--…). It refuses anything that
// is not one plain hostname: schemes, ports, paths, queries, userinfo,
// wildcards, IP literals in any spelling, empty or over-long labels,
// characters outside letters, digits and hyphens, single-label names, and
// non-ASCII input that does not survive an IDNA round trip unchanged (IDNA
// silently drops invisible characters such as U+200B and folds look-alikes
// such as fullwidth letters: such input would bind the secret to a host
// other than the one the caller typed).
//
// The error's message is safe to show a client and names the rule broken;
// it does not repeat the input.
func NormalizeHost(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("empty hostname")
	}
	if !utf8.ValidString(raw) {
		return "", errors.New("not valid UTF-8")
	}
	// Shapes that are not a bare hostname, most specific first, so the
	// message tells the caller what to remove.
	switch {
	case strings.Contains(raw, "://"):
		return "", errors.New("schemes are not allowed: give the bare hostname")
	case strings.ContainsRune(raw, '@'):
		return "", errors.New("userinfo is not allowed: give the bare hostname")
	case strings.ContainsAny(raw, "/?#\\"):
		return "", errors.New("paths, queries and fragments are not allowed: give the bare hostname")
	case strings.ContainsRune(raw, '*'):
		return "", errors.New("wildcards are not allowed: list each exact hostname")
	case strings.ContainsAny(raw, "[]") || strings.Count(raw, ":") > 1:
		return "", errors.New("IP addresses are not allowed: give a DNS hostname")
	case strings.ContainsRune(raw, ':'):
		return "", errors.New("ports are not allowed: give the bare hostname")
	}
	host := strings.ToLower(raw)
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return "", errors.New("empty hostname")
	}
	if !isASCII(host) {
		a, err := idna.Lookup.ToASCII(host)
		if err != nil {
			return "", errors.New("not a valid internationalized hostname: give its A-label (xn--) form")
		}
		if u, err := idna.Lookup.ToUnicode(a); err != nil || u != host {
			return "", errors.New("contains characters that IDNA drops or changes (invisible or look-alike characters): give the A-label (xn--) form")
		}
		host = a
	}
	if len(host) > MaxHostName {
		return "", errors.New("longer than 253 characters")
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", err
		}
	}
	if len(labels) < 2 {
		return "", errors.New("single-label names are not allowed: give the fully qualified hostname")
	}
	if numericLabel(labels[len(labels)-1]) {
		// WHATWG URL parsing reads a host whose last label is a number
		// (decimal, octal or 0x-hex) as an IPv4 address: 127.0.0.1,
		// 0x7f.1 and 2130706433 all reach the same place.
		return "", errors.New("IP addresses are not allowed: give a DNS hostname")
	}
	if strings.Contains(host, "xn--") {
		// An A-label given directly must be valid Punycode that decodes to
		// a valid U-label, and encode back to itself.
		u, err := idna.Lookup.ToUnicode(host)
		if err != nil {
			return "", errors.New("not a valid internationalized hostname (bad xn-- label)")
		}
		if a, err := idna.Lookup.ToASCII(u); err != nil || a != host {
			return "", errors.New("not a valid internationalized hostname (xn-- label is not canonical)")
		}
	}
	return host, nil
}

func checkLabel(l string) error {
	if l == "" {
		return errors.New("empty label (two dots in a row, or a leading dot)")
	}
	if len(l) > maxLabel {
		return errors.New("a label is longer than 63 characters")
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return errors.New("labels may hold only letters, digits and hyphens")
		}
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return errors.New("a label may not start or end with a hyphen")
	}
	return nil
}

// numericLabel reports whether the WHATWG URL parser would read l as a
// number: all decimal digits, or 0x followed by hex digits (possibly none).
func numericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
