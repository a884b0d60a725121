package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/buildinfo"
)

// version prints the build line the gateway compares with its own.
func TestVersionIsTheBuildLine(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), buildinfo.Get().String(); got != want {
		t.Fatalf("version %q, want %q", got, want)
	}
}

// --jail needs the gateway's jails and relays: this binary refuses it, and
// knows no gateway command.
func TestRefusesWhatNeedsTheGateway(t *testing.T) {
	t.Setenv("COHORT_INTERN_SECRET", "s3cret-for-the-test")
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"intern", "--jail", "--data-dir", t.TempDir()}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--jail needs the cohort binary") {
		t.Fatalf("intern --jail: %v", err)
	}
	for _, cmd := range []string{"serve", "admin", "migrate"} {
		if err := run(context.Background(), []string{cmd}, &out, &errb); err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
}
