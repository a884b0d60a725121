//go:build !linux

package jail

// UnderGVisor is false off Linux: gVisor's kernel is a Linux.
func UnderGVisor() bool { return false }
