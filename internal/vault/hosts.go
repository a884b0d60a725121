package vault

import (
	"strings"

	"github.com/cohort-dev/cohort/internal/vaulthost"
)

// MaxHostName is the longest DNS name without its trailing dot; see vaulthost.
const MaxHostName = vaulthost.MaxHostName

// NormalizeHost returns the canonical form of an exact DNS hostname, the
// form the vault stores and matches on (vaulthost.NormalizeHost: one
// implementation for the vault and the http_request tool).
func NormalizeHost(raw string) (string, error) { return vaulthost.NormalizeHost(raw) }

// hostHeader reduces a request's Host header to the name it addresses:
// lowercase, without port or trailing dot. It is only compared against the
// configured regional hostnames, never stored.
func hostHeader(h string) string {
	h = strings.ToLower(h)
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}
