//go:build !unix

package egress

import "errors"

// RaiseFileLimit is not available off Unix.
func RaiseFileLimit() (uint64, error) { return 0, errors.New("egress: no RLIMIT_NOFILE here") }
