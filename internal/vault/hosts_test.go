package vault_test

import (
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/vault"
)

func TestNormalizeHost(t *testing.T) {
	t.Parallel()
	label63 := strings.Repeat("a", 63)
	// 63+1+63+1+63+1+61 = 253 characters.
	name253 := label63 + "." + label63 + "." + label63 + "." + strings.Repeat("b", 61)
	ok := []struct{ in, want string }{
		{"x.com", "x.com"},
		{"X.COM.", "x.com"},
		{"Api.Example.COM", "api.example.com"},
		{"a-b.example.com", "a-b.example.com"},
		{"1password.com", "1password.com"},
		{"x.com1", "x.com1"},
		{"x.0xg", "x.0xg"}, // not hex: a name
		{label63 + ".com", label63 + ".com"},
		{name253, name253},
		{name253 + ".", name253}, // 254 characters with the trailing dot
		{"bücher.de", "xn--bcher-kva.de"},
		{"BÜCHER.de", "xn--bcher-kva.de"},
		{"xn--bcher-kva.de", "xn--bcher-kva.de"},
		{"例え.jp", "xn--r8jz45g.jp"},
	}
	for _, c := range ok {
		got, err := vault.NormalizeHost(c.in)
		if err != nil || got != c.want {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty"},
		{".", "empty"},
		{"x.com..", "empty label"},
		{".x.com", "empty label"},
		{"a..b", "empty label"},
		{"https://x.com", "schemes"},
		{"HTTP://x.com", "schemes"},
		{"x.com:443", "ports"},
		{"x.com:", "ports"},
		{"x.com/p", "paths"},
		{"x.com?q", "paths"},
		{"x.com#f", "paths"},
		{`x.com\p`, "paths"},
		{"user@x.com", "userinfo"},
		{"user:pw@x.com", "userinfo"},
		{"*.x.com", "wildcards"},
		{"x*.com", "wildcards"},
		{"127.0.0.1", "IP addresses"},
		{"0x7f.1", "IP addresses"},
		{"2130706433", "single-label"}, // one label: refused as a single label (and it is numeric)
		{"x.2130706433", "IP addresses"},
		{"0177.0.0.1", "IP addresses"},
		{"1.2.3.0x0a", "IP addresses"},
		{"a.0x", "IP addresses"},
		{"[::1]", "IP addresses"},
		{"::1", "IP addresses"},
		{"[fe80::1%25eth0]", "IP addresses"},
		{"localhost", "single-label"},
		{"x_y.com", "letters, digits and hyphens"},
		{"x y.com", "letters, digits and hyphens"},
		{"x.com\n", "letters, digits and hyphens"},
		{"x\x00.com", "letters, digits and hyphens"},
		{"-x.com", "hyphen"},
		{"x-.com", "hyphen"},
		{strings.Repeat("a", 64) + ".com", "63"},
		{name253 + "c", "253"},
		{"x\u200b.com", "IDNA"}, // zero-width space, silently dropped by IDNA
		{"ｘ.com", "IDNA"},       // fullwidth x folds to x
		{"x。com", "IDNA"},       // ideographic full stop folds to a dot
		{"xn--zz.com", "internationalized"},
		{"xn--bcher-kva\u200b.de", "IDNA"},
		{"x.com\xff", "UTF-8"},
	}
	for _, c := range bad {
		got, err := vault.NormalizeHost(c.in)
		if err == nil {
			t.Errorf("NormalizeHost(%q) = %q, want an error about %q", c.in, got, c.msg)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("NormalizeHost(%q): error %q does not mention %q", c.in, err, c.msg)
		}
	}
}

func TestNormalizeHostsBoundsAndDuplicates(t *testing.T) {
	t.Parallel()
	got, err := vault.NormalizeHosts([]string{"X.com", "x.com.", "y.com", "x.COM"})
	if err != nil || strings.Join(got, ",") != "x.com,y.com" {
		t.Fatalf("duplicates: %v %v", got, err)
	}
	if _, err := vault.NormalizeHosts(hostsN(100)); err != nil {
		t.Fatalf("100 hosts: %v", err)
	}
	for _, n := range []int{0, 101} {
		_, err := vault.NormalizeHosts(hostsN(n))
		if !apierr.Is(err, 400, "bad_request") || !strings.Contains(err.Error(), "1 to 100 entries") {
			t.Fatalf("%d hosts: %v", n, err)
		}
	}
	// An entry names its index and shows the input escaped.
	_, err = vault.NormalizeHosts([]string{"a.com", "x\u200b.com"})
	if !apierr.Is(err, 400, "bad_request") || !strings.Contains(err.Error(), `hosts[1] "x\u200b.com"`) {
		t.Fatalf("named entry: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "ab", "a1", "a_b", "a_b_c", "api_key_2", "z" + strings.Repeat("9", 254)} {
		if err := vault.CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, c := range []struct{ in, msg string }{
		{"", "1 to 255"},
		{"a" + strings.Repeat("b", 255), "1 to 255"},
		{"A", "start with a lowercase letter"},
		{"aB", "only lowercase letters"},
		{"_a", "start with a lowercase letter"},
		{"1a", "start with a lowercase letter"},
		{"a_", "end with an underscore"},
		{"a__b", "two underscores"},
		{"a-b", "only lowercase letters"},
		{"a.b", "only lowercase letters"},
		{"é", "start with a lowercase letter"},
		{"aé", "only lowercase letters"},
	} {
		err := vault.CheckName(c.in)
		if !apierr.Is(err, 400, "bad_request") || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("CheckName(%q) = %v, want 400 mentioning %q", c.in, err, c.msg)
		}
	}
}
