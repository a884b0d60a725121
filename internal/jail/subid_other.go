//go:build !linux

package jail

import "os"

// HostIDs is the Spec's ids off Linux (no jail runs there).
func HostIDs(spec Spec) (uid, gid int, err error) { return spec.UID, spec.GID, nil }

// Chown is not available off Linux.
func Chown(dir string, uid, gid int) error { return ErrUnsupported }

// RemoveAll is os.RemoveAll off Linux.
func RemoveAll(path string) error { return os.RemoveAll(path) }
