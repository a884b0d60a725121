package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for cohort-bench when the load
// commands start their mock servers (`<this binary> mock-model`, …), which
// must run the command, not the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && slices.Contains([]string{"mock-model", "sse-serve", "mock-daemon", "floor-relay"}, os.Args[1]) {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			os.Stderr.WriteString("cohort-bench: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the cohort binary the tests measure, built once (buildCohort,
// as the commands do without --cohort).
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func cohortBin(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "cohort-bench-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "cohort")
		// A first build of the static cohort-intern compiles the standard
		// library anew (CGO_ENABLED=0): minutes on a loaded 2-core machine.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		built.err = buildCohort(ctx, built.bin)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// TestBenchChatRefusesUnknownPhase: a mistyped --only is an error naming
// the choices, before any process starts.
func TestBenchChatRefusesUnknownPhase(t *testing.T) {
	var out, errs strings.Builder
	err := benchChat(context.Background(), []string{"--only", "both"}, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "--only must be whole or alone") || out.Len() != 0 {
		t.Fatalf("err %v, output %q", err, out.String())
	}
}

// TestBenchChat runs the load command small: every phase runs against real
// processes (gateway, daemon with the built-in agent, mock model, scripted
// daemon, bare SSE server) and every chunk the scripted daemon sends is
// relayed.
func TestBenchChat(t *testing.T) {
	bin := cohortBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs strings.Builder
	err := benchChat(ctx, []string{"--cohort", bin, "--turns", "5", "--chunks", "200", "--bare-chunks", "1000",
		"--streams", "2", "--stream-chunks", "50", "--idle-streams", "5"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	o := out.String()
	for _, want := range []string{"== whole path", "== gateway alone", "added by the gateway, paired", "ratio", "estimate, from CPU time", "model chunks/s end to end", "(100 of 100 model chunks arrived)", "CPU per model chunk             gateway"} {
		if strings.Count(o, want) < 1 {
			t.Errorf("output lacks %q:\n%s", want, o)
		}
	}
	relayed := regexp.MustCompile(`gateway relay \(\s*(\d+) chunks\)`).FindAllStringSubmatch(o, -1)
	if len(relayed) != 2 {
		t.Fatalf("want a relay figure per phase:\n%s", o)
	}
	whole, _ := strconv.Atoi(relayed[0][1])
	alone, _ := strconv.Atoi(relayed[1][1])
	// The daemon may merge deltas its consumer has not taken; the scripted
	// daemon sends every chunk as its own event: 200 deltas, the role chunk,
	// the finish chunk, the final chunk and [DONE] are the data lines.
	if whole < 4 || whole > 204 || alone != 204 {
		t.Errorf("relayed %d (whole path) and %d (gateway alone) chunks:\n%s", whole, alone, o)
	}
	if !regexp.MustCompile(`(?m)^  gateway\s+5\s`).MatchString(o) {
		t.Errorf("not every idle stream opened:\n%s", o)
	}
}

// TestBenchFleet runs the fleet load command small against real processes:
// sleeping interns cost no process, woken ones answer, shutdown ends them.
func TestBenchFleet(t *testing.T) {
	bin := cohortBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs strings.Builder
	err := benchFleet(ctx, []string{"--cohort", bin, "--sleeping", "60", "--awake", "4", "--wakes", "3"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	o := out.String()
	for _, re := range []string{`\(sleeping interns: 0\)`, `sleeping intern \(wake included\): p50 \S+ p99`,
		`4 of 4 answered a second turn`, `== 8 interns awake`, `== shutdown of 8 awake interns: \S+`,
		`answered 5 turns in \S+; 24 of 24 intern processes are the same`, `bytes per sleeping intern`,
		`(?m)^  init\s+8 processes, \S+ MiB per intern \(anonymous \S+, file \S+\)$`,
		`(?m)^  daemon\s+8 processes, `, `(?m)^  agent\s+8 processes, `} {
		if !regexp.MustCompile(re).MatchString(o) {
			t.Errorf("output lacks %s:\n%s", re, o)
		}
	}
}

func TestBenchFleetRefusesBadCounts(t *testing.T) {
	var out, errs strings.Builder
	err := benchFleet(context.Background(), []string{"--sleeping", "10", "--awake", "20"}, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "--sleeping") {
		t.Fatalf("err %v", err)
	}
}

// TestBenchSessions runs the sessions load command small against a real
// daemon and agent: every session left memory after the idle TTLs.
func TestBenchSessions(t *testing.T) {
	bin := cohortBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs strings.Builder
	if err := benchSessions(ctx, []string{"--cohort", bin, "--sessions", "40", "--idle-ttl", "1s"}, &out, &errs); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	o := out.String()
	if !regexp.MustCompile(`after the idle TTLs\s+\S+ MiB\s+\S+ MiB\s+0\n`).MatchString(o) || !strings.Contains(o, "sessions kept: 41") {
		t.Fatalf("output:\n%s", o)
	}
}

// TestBenchSessionsGateway runs the sessions load command through a real
// gateway, small: a row per count with every process measured, and no
// process left under the gateway but the jail's init, daemon and agent.
func TestBenchSessionsGateway(t *testing.T) {
	bin := cohortBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs strings.Builder
	if err := benchSessions(ctx, []string{"--cohort", bin, "--gateway", "--at", "30,60", "--parallel", "4", "--settle", "0s"}, &out, &errs); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	o := out.String()
	for _, n := range []string{"0", "30", "60"} {
		// sessions, took, then four RSS / PSS cells (none zero), heap,
		// goroutines, descriptors, and no other process.
		cell := `[1-9][0-9.]* / [1-9][0-9.]*\s+`
		if !regexp.MustCompile(`(?m)^` + n + `\s+\S+\s+` + strings.Repeat(cell, 4) + `\S+\s+\d+\s+\d+/\d+/\d+\s+0$`).MatchString(o) {
			t.Errorf("no row for %s sessions:\n%s", n, o)
		}
	}
	if !strings.Contains(o, "RSS from 30 to 60 sessions") {
		t.Errorf("output:\n%s", o)
	}
}

func TestBenchSessionsRefusesBadCounts(t *testing.T) {
	for _, at := range []string{"0", "100,50", "x", "10,10"} {
		err := benchSessions(context.Background(), []string{"--gateway", "--at", at, "--cohort", "/nonexistent"}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--at") {
			t.Errorf("--at %s: %v", at, err)
		}
	}
}
