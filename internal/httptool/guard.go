package httptool

import (
	"fmt"
	"syscall"

	"github.com/cohort-dev/cohort/internal/safehttp"
)

// guard decides which addresses a request may connect to. It runs in the
// dialer's Control hook, after DNS resolution, on the address actually
// dialled: a DNS answer that changes between a check and the connection
// cannot get past it, and neither can a redirect. The rule is safehttp's
// (public addresses, never the machine's own).
type guard struct {
	dial *safehttp.DialGuard
	// proxy is the one address dialled when a proxy carries the requests
	// (the jail's egress relay, which applies the same rule itself).
	proxy string
}

func newGuard(allowLoopback bool) *guard {
	return &guard{dial: safehttp.NewDialGuard(allowLoopback)}
}

func (g *guard) control(network, address string, c syscall.RawConn) error {
	if g.proxy != "" {
		if address == g.proxy {
			return nil
		}
		return fmt.Errorf("%w: %s is not the proxy", safehttp.ErrRefusedAddress, address)
	}
	return g.dial.Control(network, address, c)
}
