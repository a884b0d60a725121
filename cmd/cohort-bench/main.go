// Command cohort-bench is the load generator of docs/benchmarks.md and its
// mock servers. It is kept out of the product binary: it drives a cohort
// binary (serve, intern, admin) as child processes, built from ./cmd/cohort
// unless --cohort names one, and starts itself for the mock servers.
//
//	go run ./cmd/cohort-bench chat         the chat path's figures (docs/benchmarks.md, Chat)
//	go run ./cmd/cohort-bench e2e          what a caller pays: the model directly, through Cohort and through a peer gateway
//	go run ./cmd/cohort-bench fleet        sleeping, waking and awake interns (docs/benchmarks.md, Fleet)
//	go run ./cmd/cohort-bench sessions     a daemon's and its agent's memory over many sessions (--gateway: and the gateway's, through its chat API)
//	go run ./cmd/cohort-bench neighbour    a neighbour's latency beside an abusive intern; wakes with limits on and off
//	go run ./cmd/cohort-bench mock-model   an OpenAI-compatible model that schedules chunks (child)
//	go run ./cmd/cohort-bench sse-serve    a bare Go SSE server, the reference (child)
//	go run ./cmd/cohort-bench mock-daemon  an intern daemon that streams its schedule at once (child)
//	go run ./cmd/cohort-bench floor-relay  a bare relay hop (tcp) or bare SSE relay hop (sse) in front of the model, e2e's floor (child)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
)

const usage = `cohort-bench — load figures of a cohort binary (docs/benchmarks.md).

Usage:
  cohort-bench chat     [flags]  the chat path: time to first chunk, relay cost, throughput, idle streams
  cohort-bench e2e      [flags]  what a caller pays: the model directly, the floor (bare relay hops), through
                                 Cohort, through a peer gateway; --scale: N paced streams at once
  cohort-bench fleet    [flags]  sleeping, waking and awake interns under one gateway
  cohort-bench sessions [flags]  a daemon's and its agent's memory over many sessions;
                                 --gateway: gateway, daemon and agent, through the chat API
  cohort-bench neighbour [flags] a neighbour's latency beside an abusive intern (limits per intern)

Each takes --cohort PATH, the cohort binary to measure; without it ./cmd/cohort is
built (go build) into a temporary directory first. mock-model, sse-serve,
mock-daemon and floor-relay are the children it starts.

Run "cohort-bench <command> -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "cohort-bench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("want chat, e2e, fleet, sessions, neighbour, mock-model, sse-serve, mock-daemon or floor-relay")
	}
	switch args[0] {
	case "chat":
		return benchChat(ctx, args[1:], stdout, stderr)
	case "e2e":
		return benchE2E(ctx, args[1:], stdout, stderr)
	case "fleet":
		return benchFleet(ctx, args[1:], stdout, stderr)
	case "sessions":
		return benchSessions(ctx, args[1:], stdout, stderr)
	case "neighbour":
		return benchNeighbour(ctx, args[1:], stdout, stderr)
	case "mock-model":
		return benchServe(ctx, http.HandlerFunc(mockModel), stdout)
	case "floor-relay":
		return floorRelay(ctx, args[1:], stdout)
	case "sse-serve":
		return benchServe(ctx, http.HandlerFunc(bareSSE), stdout)
	case "mock-daemon":
		mux := http.NewServeMux()
		mux.Handle(interndv1connect.NewInternDaemonServiceHandler(scriptedDaemon{}, connect.WithCompressMinBytes(4096)))
		return benchServe(ctx, mux, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// cohortFlag registers --cohort, the binary a load command measures.
func cohortFlag(fs *flag.FlagSet) *string {
	return fs.String("cohort", "", "the cohort binary to measure (default: go build ./cmd/cohort into a temporary directory)")
}

// gvisorFlags are the gateway's runsc and platform under --provisioner
// gvisor; the returned function gives serve's flags for them.
func gvisorFlags(fs *flag.FlagSet) (runsc *string, serve func() []string) {
	runsc = fs.String("gvisor-runsc", "runsc", "with --provisioner gvisor, the gateway's runsc (Debian's on PATH; the pinned release: CGO_ENABLED=0 go tool -modfile=tools/gvisor/go.mod -n gvisor.dev/gvisor/runsc)")
	platform := fs.String("gvisor-platform", "", "with --provisioner gvisor, runsc's --platform (default: runsc's own)")
	return runsc, func() []string {
		args := []string{"--gvisor-runsc", *runsc}
		if *platform != "" {
			args = append(args, "--gvisor-platform", *platform)
		}
		return args
	}
}

// cohortBinary returns the cohort binary to run: path when set, else one
// built from this module's ./cmd/cohort into dir (the go command must be
// on PATH and the working directory inside the module).
func cohortBinary(ctx context.Context, path, dir string, stderr io.Writer) (string, error) {
	if path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("--cohort: %w", err)
		}
		return abs, nil
	}
	bin := filepath.Join(dir, "cohort")
	fmt.Fprintf(stderr, "building ./cmd/cohort into %s (--cohort PATH measures a binary of your own)\n", bin)
	if err := buildCohort(ctx, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// buildCohort builds the cohort command of this module into bin, and
// cohort-intern beside it (what a gateway's local interns run from).
func buildCohort(ctx context.Context, bin string) error {
	for cmd, out := range map[string]string{"cohort": bin, "cohort-intern": filepath.Join(filepath.Dir(bin), "cohort-intern")} {
		build := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/cohort-dev/cohort/cmd/"+cmd)
		if cmd == "cohort-intern" {
			// Static, as the image builds it: 0.35 MiB less per awake
			// intern than linked to libc (docs/benchmarks.md).
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		out, err := build.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build ./cmd/%s (or pass --cohort PATH): %w\n%s", cmd, err, out)
		}
	}
	return nil
}

// benchServe serves h on a loopback port and prints the address first.
func benchServe(ctx context.Context, h http.Handler, stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // the scripted daemon is called over h2c
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: &protos}
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
