package interncmd_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/interncmd"
)

// TestUnjailedRefusesSecretFile: without --jail the agent runs as the
// daemon's user, so a secret file the daemon reads is the agent's to read
// (and with it the daemon's credential to the vault). The daemon refuses
// before it reads or writes anything, naming --jail and the environment.
func TestUnjailedRefusesSecretFile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("s3cret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	var stderr strings.Builder
	err := interncmd.Intern(context.Background(), []string{"--secret-file", secret, "--data-dir", data, "--listen", "127.0.0.1:0"}, io.Discard, &stderr, nil)
	if err == nil || !strings.Contains(err.Error(), "--jail") || !strings.Contains(err.Error(), "COHORT_INTERN_SECRET") {
		t.Fatalf("want a refusal naming --jail and COHORT_INTERN_SECRET, got %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(stderr.String(), "s3cret") {
		t.Fatal("the refusal shows the secret")
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("the refused daemon made its data directory: %v", err)
	}
}

// TestScrubEnviron: the value leaves the environment block the kernel
// shows to other processes (/proc/<pid>/environ, which root, and a
// Landlock domain on some kernels, may read), while the process's own
// environment keeps it until read.
func TestScrubEnviron(t *testing.T) {
	if os.Getenv("COHORT_TEST_SCRUB") == "1" {
		interncmd.ScrubEnviron("SCRUB_ME")
		raw, _ := os.ReadFile("/proc/self/environ")
		fmt.Printf("kernel-sees-value=%v go-keeps-value=%v other-kept=%v\n",
			strings.Contains(string(raw), "scrub-canary-value"), os.Getenv("SCRUB_ME") == "scrub-canary-value",
			strings.Contains(string(raw), "KEEP_ME=kept"))
		os.Exit(0)
	}
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestScrubEnviron$")
	cmd.Env = append(os.Environ(), "COHORT_TEST_SCRUB=1", "SCRUB_ME=scrub-canary-value", "KEEP_ME=kept")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatal(err, string(out))
	}
	if !strings.Contains(string(out), "kernel-sees-value=false go-keeps-value=true other-kept=true") {
		t.Fatalf("got %s", out)
	}
}
