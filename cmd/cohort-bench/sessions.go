package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/procstat"
)

// benchSessions is `cohort-bench sessions`: one real daemon (`cohort
// intern`) with the built-in agent takes turns in many new sessions; its
// and its agent's resident memory are read fresh, right after, and once
// the idle sessions have left memory.
//
//	cohort-bench sessions [--sessions 10000] [--idle-ttl 5s] [--cohort PATH]
//
// With --gateway the turns go through a gateway's chat API instead, and
// the gateway's memory is measured too (gatewaySessions):
//
//	cohort-bench sessions --gateway [--at 1000,10000] [--parallel 4] [--settle 5s]
func benchSessions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cohort-bench sessions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("sessions", 10000, "new sessions, one turn each")
	parallel := fs.Int("parallel", 8, "turns at once")
	ttl := fs.Duration("idle-ttl", 5*time.Second, "the daemon's session idle TTL (the agent's is twice it)")
	viaGateway := fs.Bool("gateway", false, "through a gateway (cohort serve, the local provisioner, the demo intern): the memory of gateway, daemon and agent at each count of --at")
	atFlag := fs.String("at", "1000,10000", "with --gateway, the session counts at which memory is read (after 0 too)")
	settle := fs.Duration("settle", 5*time.Second, "with --gateway, the pause before each reading")
	cohortPath := cohortFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *viaGateway {
		at, err := parseCounts(*atFlag)
		if err != nil {
			return err
		}
		if *parallel < 1 {
			return errors.New("sessions: want --parallel ≥ 1")
		}
		cohort, dir, err := benchDir(ctx, "sessions-gw", *cohortPath, stderr)
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		return gatewaySessions(ctx, cohort, dir, at, *parallel, *settle, stdout, stderr)
	}
	if *n < 1 || *parallel < 1 || *ttl <= 0 {
		return errors.New("sessions: want --sessions ≥ 1, --parallel ≥ 1 and a positive --idle-ttl")
	}
	cohort, dir, err := benchDir(ctx, "sessions", *cohortPath, stderr)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	secret := "bench-sessions-secret"
	cmd := exec.CommandContext(ctx, cohort, "intern", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--intern-id", "bench", "--log-level", "warn",
		"--session-idle-ttl", ttl.String())
	// Unjailed: the secret in the environment (--secret-file needs --jail).
	cmd.Env = append(os.Environ(), "COHORT_AGENT_SESSION_IDLE_TTL="+(2**ttl).String(), "COHORT_INTERN_SECRET="+secret)
	base, err := startListening(cmd, stderr)
	if err != nil {
		return err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: bearer{rt: &http.Transport{Protocols: &protos}, header: "Bearer " + launch.GatewayCredential(secret)}}
	client := interndv1connect.NewInternDaemonServiceClient(hc, base)
	turn := func(session string) error {
		st, err := client.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: session, Prompt: "hello",
			ApprovalMode: pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE}))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err()
	}
	rss := func() (daemon, agent float64) {
		tree := procstat.Tree(cmd.Process.Pid)
		daemon = procstat.RSS(tree[0])
		for _, p := range tree[1:] {
			agent += procstat.RSS(p)
		}
		return daemon / (1 << 20), agent / (1 << 20)
	}
	if err := turn("warm"); err != nil {
		return err
	}
	time.Sleep(time.Second)
	d0, a0 := rss()

	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	t0 := time.Now()
	for range *parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(*n) {
					return
				}
				if err := turn("s-" + strconv.FormatInt(i, 10)); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	took := time.Since(t0)
	d1, a1 := rss()
	st, err := client.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return err
	}
	live1 := st.Msg.GetLiveSessions()
	time.Sleep(2**ttl + 3*time.Second)
	d2, a2 := rss()
	st, err = client.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d sessions, one turn each, in %s (%d at once)\n", *n, took.Round(time.Millisecond), *parallel)
	fmt.Fprintf(stdout, "%-28s %10s %10s %14s\n", "", "daemon", "agent", "live sessions")
	fmt.Fprintf(stdout, "%-28s %7.1f MiB %7.1f MiB %14d\n", "fresh", d0, a0, 1)
	fmt.Fprintf(stdout, "%-28s %7.1f MiB %7.1f MiB %14d\n", "after the turns", d1, a1, live1)
	fmt.Fprintf(stdout, "%-28s %7.1f MiB %7.1f MiB %14d\n", "after the idle TTLs", d2, a2, st.Msg.GetLiveSessions())
	fmt.Fprintf(stdout, "ratio to fresh, after the TTLs: daemon %.2f×, agent %.2f× (goal ≤ 2×); sessions kept: %d\n", d2/d0, a2/a0, st.Msg.GetSessions())
	return nil
}
