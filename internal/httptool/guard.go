package httptool

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// ErrRefusedAddress is returned (wrapped) when a connection would reach an
// address that is not public, or one of the service's own.
var ErrRefusedAddress = errors.New("refused destination address")

// nonPublic are ranges beyond what the netip predicates cover.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64: may embed a private IPv4
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64
	netip.MustParsePrefix("100::/64"),        // discard
	netip.MustParsePrefix("2001::/32"),       // Teredo: embeds an IPv4
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("2002::/16"),       // 6to4: embeds an IPv4
	netip.MustParsePrefix("fec0::/10"),       // deprecated site-local
}

// guard decides which addresses a request may connect to. It runs in the
// dialer's Control hook, after DNS resolution, on the address actually
// dialled: a DNS answer that changes between a check and the connection
// cannot get past it, and neither can a redirect.
type guard struct {
	allowLoopback bool
	own           map[netip.Addr]bool
}

// newGuard collects the machine's own (non-loopback) interface addresses:
// the service never sends a request to itself, even on a public address.
func newGuard(allowLoopback bool) *guard {
	g := &guard{allowLoopback: allowLoopback, own: map[netip.Addr]bool{}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLoopback() {
				g.own[p.Addr().Unmap()] = true
			}
		}
	}
	return g
}

func (g *guard) control(network, address string, _ syscall.RawConn) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("%w: network %s", ErrRefusedAddress, network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, address)
	}
	return g.check(ap.Addr())
}

// check reports whether ip may be connected to: public unicast, not one of
// the service's own addresses. Loopback only with the test override.
func (g *guard) check(ip netip.Addr) error {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		if g.allowLoopback {
			return nil
		}
		return fmt.Errorf("%w: %s is a loopback address", ErrRefusedAddress, ip)
	case !ip.IsValid() || ip.IsUnspecified():
		return fmt.Errorf("%w: %s is unspecified", ErrRefusedAddress, ip)
	case ip.IsPrivate():
		return fmt.Errorf("%w: %s is a private address", ErrRefusedAddress, ip)
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return fmt.Errorf("%w: %s is a link-local address (cloud metadata lives there)", ErrRefusedAddress, ip)
	case ip.IsMulticast() || !ip.IsGlobalUnicast():
		return fmt.Errorf("%w: %s is not a public unicast address", ErrRefusedAddress, ip)
	case g.own[ip]:
		return fmt.Errorf("%w: %s is one of this service's own addresses", ErrRefusedAddress, ip)
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is in the non-public range %s", ErrRefusedAddress, ip, p)
		}
	}
	return nil
}
