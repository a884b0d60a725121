//go:build !linux

package jail

import (
	"io"
	"net"
	"syscall"
	"time"
)

// Start is not available off Linux.
func Start(spec Spec, o Options) (*Jail, error) { return nil, ErrUnsupported }

// Attach is not available off Linux.
func Attach(path string, output io.Writer) (*Jail, error) { return nil, ErrUnsupported }

// Accept is not available off Linux.
func (j *Jail) Accept() (byte, net.Conn, error) { return 0, nil, ErrUnsupported }

// Signal is not available off Linux.
func (j *Jail) Signal(sig syscall.Signal) error { return ErrUnsupported }

// SetOrphan is not available off Linux.
func (j *Jail) SetOrphan(d time.Duration) error { return ErrUnsupported }

// Kill is not available off Linux.
func (j *Jail) Kill() {}

// Detach is not available off Linux.
func (j *Jail) Detach() {}

// Probe reports that this platform cannot make jails.
func Probe(spec Spec) error { return ErrUnsupported }

// Alive is false off Linux.
func Alive(path string) bool { return false }

// SealInherited does nothing off Linux.
func SealInherited() error { return nil }
