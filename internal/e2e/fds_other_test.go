//go:build !linux

package e2e_test

import "errors"

// socketNetNS needs Linux (pidfd_getfd, SIOCGSKNS).
func socketNetNS(pid, fd int) (uint64, error) { return 0, errors.New("not on this platform") }
