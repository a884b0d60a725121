package safehttp

import (
	"fmt"
	"net/netip"
	"strings"
)

// metadata is the cloud metadata address: never reachable, whatever an
// operator lists.
var metadata = netip.MustParseAddr("169.254.169.254")

// Allowlist names non-public destinations an operator trusts (an identity
// provider on the private network): addresses in listed ranges, and any
// private address a listed hostname resolves to. Loopback and link-local
// addresses pass only when a listed range holds them, and the cloud
// metadata address never does.
type Allowlist struct {
	hosts map[string]bool
	nets  []netip.Prefix
}

// ParseAllowlist reads entries: hostnames (keycloak.internal), addresses
// (10.1.2.3) and ranges (10.0.0.0/8, fd00::/8).
func ParseAllowlist(entries []string) (*Allowlist, error) {
	a := &Allowlist{hosts: map[string]bool{}}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address range such as 10.0.0.0/8", e)
			}
			a.nets = append(a.nets, p.Masked())
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				a.nets = append(a.nets, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			h := strings.ToLower(strings.TrimSuffix(e, "."))
			if strings.ContainsAny(h, ":/ @") || h == "" {
				return nil, fmt.Errorf("%q is neither a hostname, an address nor a range", e)
			}
			a.hosts[h] = true
		}
	}
	return a, nil
}

// Permits reports whether host (as the URL names it) may connect to ip,
// which the public-address rule refused.
func (a *Allowlist) Permits(host string, ip netip.Addr) bool {
	if a == nil {
		return false
	}
	ip = ip.Unmap()
	if ip == metadata {
		return false
	}
	for _, p := range a.nets {
		if p.Contains(ip) {
			return true
		}
	}
	if a.hosts[strings.ToLower(strings.TrimSuffix(host, "."))] {
		return !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsUnspecified() && !ip.IsMulticast()
	}
	return false
}
