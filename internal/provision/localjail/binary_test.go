package localjail

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/buildinfo"
)

// InternBinary runs interns from cohort-intern beside the gateway only
// when it reports the gateway's own build; another build, one that does
// not answer, or none there leaves them on the gateway's executable.
func TestInternBinaryChoice(t *testing.T) {
	t.Parallel()
	script := func(dir, body string) string {
		p := filepath.Join(dir, InternBinaryName)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	same := "echo '" + buildinfo.Get().String() + "'"
	for _, tc := range []struct {
		name, body, setting string
		small, refused      bool
	}{
		{name: "beside, same build", body: same, small: true},
		{name: "beside, another build", body: "echo 'cohort v0.0.1 commit 0123abc go1.20'", refused: true},
		{name: "beside, no answer", body: "exit 3", refused: true},
		{name: "none beside"},
		{name: "setting, another build", body: "echo 'cohort v9 commit 9 go1.99'", setting: "x", refused: true},
		{name: "setting, missing", setting: "/nonexistent/cohort-intern", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			self := filepath.Join(dir, "cohort")
			var small string
			if tc.body != "" {
				small = script(dir, tc.body)
			}
			setting := tc.setting
			if setting == "x" {
				// An explicit setting elsewhere than beside the gateway.
				other := t.TempDir()
				setting = script(other, tc.body)
				small = ""
			}
			var logs bytes.Buffer
			got := InternBinary(context.Background(), setting, self, slog.New(slog.NewTextHandler(&logs, nil)))
			want := self
			if tc.small {
				want = small
			}
			if got != want {
				t.Fatalf("got %s, want %s; log:\n%s", got, want, logs.String())
			}
			if warned := strings.Contains(logs.String(), "level=WARN"); warned != tc.refused {
				t.Fatalf("warned %v, want %v; log:\n%s", warned, tc.refused, logs.String())
			}
		})
	}
}
