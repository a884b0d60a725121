//go:build !linux

package jail

import "net"

// Start is not available off Linux.
func Start(spec Spec, o Options) (*Jail, error) { return nil, ErrUnsupported }

// Accept is not available off Linux.
func (j *Jail) Accept() (byte, net.Conn, error) { return 0, nil, ErrUnsupported }

// Probe reports that this platform cannot make jails.
func Probe(spec Spec) error { return ErrUnsupported }
