package httptool

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/cohort-dev/cohort/internal/safehttp"
)

// guard decides which addresses a request may connect to. It runs in the
// dialer's Control hook, after DNS resolution, on the address actually
// dialled: a DNS answer that changes between a check and the connection
// cannot get past it, and neither can a redirect. The public-address rule
// is safehttp's (one list of non-public ranges for the service); the tool
// adds the machine's own addresses.
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
		return fmt.Errorf("%w: network %s", safehttp.ErrRefusedAddress, network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", safehttp.ErrRefusedAddress, address)
	}
	ip := ap.Addr().Unmap()
	if g.own[ip] {
		return fmt.Errorf("%w: %s is one of this service's own addresses", safehttp.ErrRefusedAddress, ip)
	}
	return safehttp.CheckAddr(ip, g.allowLoopback)
}
