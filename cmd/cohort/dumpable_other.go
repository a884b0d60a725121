//go:build !linux

package main

func nonDumpable() {}
