//go:build !linux

package spawn

import "os/exec"

func start(cmd *exec.Cmd) error { return cmd.Start() }

func thread() int { return 0 }
