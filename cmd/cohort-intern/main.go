// Command cohort-intern is what runs inside an intern's jail: the jail's
// init (internal/jail takes over before main when started as its init or
// one of its helpers), the daemon (`cohort-intern intern`) and the
// built-in agent (`cohort-intern agent`). It links none of the gateway, so
// each of those processes carries only its own package initializers; the
// gateway runs its interns from it when it lies beside the gateway's
// executable and is the same build (ADR 0043).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/cohort-dev/cohort/internal/buildinfo"
	"github.com/cohort-dev/cohort/internal/interncmd"
)

const usage = `cohort-intern — the processes of an intern's jail; the gateway (cohort serve) runs it.

Usage:
  cohort-intern intern  [flags]   run one intern's daemon (cohort intern, without --jail)
  cohort-intern agent   [flags]   the built-in ACP agent on stdin/stdout
  cohort-intern version           print the build; the gateway runs it only if it prints its own
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := interncmd.Profiled(func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0) // -h asked for the flags, and got them
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cohort-intern:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "intern":
		// No --jail: that needs the gateway's jails and relays (cohort).
		return interncmd.Intern(ctx, args[1:], stdout, stderr, nil)
	case "agent":
		return interncmd.Agent(ctx, args[1:], os.Stdin, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, buildinfo.Get())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}
