package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the cohort executable: `cohort
// serve`'s local provisioner starts `<this binary> intern …` (and a daemon
// starts `<this binary> agent`), which must run the command, not the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "intern" || os.Args[1] == "agent") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			os.Stderr.WriteString("cohort: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The bootstrap demo intern ends up running under `cohort serve` with the
// local provisioner: its daemon is a real `cohort intern` process.
func TestServeRunsDemoIntern(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, _, stop := startServe(t, "--data-dir", dir)
	defer stop()
	b, err := os.ReadFile(filepath.Join(dir, "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]string
	json.Unmarshal(b, &boot)
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := cli(t, "admin", "intern", "get", "--data-dir", dir, "--org", boot["organization_id"], "--id", boot["intern_id"], "--json")
		if err != nil {
			t.Fatal(err)
		}
		var in map[string]any
		json.Unmarshal([]byte(out), &in)
		if in["state"] == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo intern never reached running: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, "interns", boot["intern_id"], "sessions")); err != nil {
		t.Fatalf("the daemon's data directory: %v", err)
	}
}
