//go:build !linux

package interncmd

func NonDumpable() {}
