//go:build unix

package store

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockFile takes an exclusive advisory lock on path (created mode 0600),
// waiting for other holders until ctx ends; the kernel releases it if the
// holder dies.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for wait := time.Millisecond; ; wait = min(wait*2, 100*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck
		f.Close()
	}, nil
}
