package main

import (
	"context"
	"runtime"
	"strings"
	"testing"
)

// cohort version and --version print the build: version, commit, Go.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		var out, errOut syncBuf
		if err := run(context.Background(), []string{arg}, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.HasPrefix(s, "cohort ") || !strings.Contains(s, " commit ") || !strings.HasSuffix(s, runtime.Version()+"\n") {
			t.Fatalf("%s: %q", arg, s)
		}
	}
}

// A malformed --cors-allow-origins entry stops serve, naming the flag,
// before anything is written.
func TestServeRejectsBadCORSOrigins(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuf
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--cors-allow-origins", "https://app.example.com,*"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--cors-allow-origins") || !strings.Contains(err.Error(), `"*"`) {
		t.Fatalf("err = %v", err)
	}
}
