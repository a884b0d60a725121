// Package spawn starts child processes that use SysProcAttr.Pdeathsig from one OS thread
// that lives as long as the process.
//
// The kernel sends a child its Pdeathsig when the thread that forked it ends, not when the
// process does (https://go.dev/issue/27505); and the Go runtime ends a thread whenever a
// goroutine exits locked to it, as jail.StartFiltered's goroutine does for every agent an
// intern daemon starts. A child forked by exec.Cmd.Start from an ordinary goroutine is on
// whatever thread that goroutine ran on, so it got its Pdeathsig whenever that thread happened
// to be the one taken and ended: #42, where the conformance suite's kube-apiserver was
// SIGKILLed mid-test and a local intern's daemon SIGTERMed ("the intern is shutting down"),
// by in-process daemons of the same test binary starting their agents.
package spawn

import "os/exec"

// Start starts cmd (exec.Cmd.Start) so that a Pdeathsig in its SysProcAttr fires only when
// this process ends.
func Start(cmd *exec.Cmd) error { return start(cmd) }

// Thread returns the OS thread Start forks from: 0 before the first Start, or where threads
// do not matter (off Linux).
func Thread() int { return thread() }
