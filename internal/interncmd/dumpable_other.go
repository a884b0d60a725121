//go:build !linux

package interncmd

func NonDumpable() {}

// ScrubEnviron does nothing off Linux.
func ScrubEnviron(string) {}
