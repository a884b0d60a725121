package e2e_test

import (
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// TestMessagesNameTheFix: `serve -h` is an answer, not a failure (exit
// 0), shows the defaults the docs state, and an unknown command still
// fails; /metrics on the API's port says where the metrics are.
func TestMessagesNameTheFix(t *testing.T) {
	out, err := exec.Command(cohortBin, "serve", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("serve -h: %v\n%s", err, tail(string(out), 2000))
	}
	if !strings.Contains(string(out), "-listen") || !strings.Contains(string(out), `-webhook-lease duration`) ||
		!flagHelpHas(string(out), "webhook-lease", `(default "1m0s")`) {
		t.Fatalf("serve -h does not show its flags and their defaults:\n%s", tail(string(out), 4000))
	}
	var exit *exec.ExitError
	if _, err := exec.Command(cohortBin, "no-such-command").CombinedOutput(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("an unknown command: %v, want exit status 1", err)
	}

	_, gw := newCluster(t, "")
	res, err := http.Get(gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 404 || !strings.Contains(string(body), "--metrics-listen") {
		t.Fatalf("GET /metrics on the API port: %d %s", res.StatusCode, body)
	}
}

// flagHelpHas reports whether the help's lines from the flag's own up to
// the next flag hold want.
func flagHelpHas(help, flag, want string) bool {
	i := strings.Index(help, "-"+flag+" ")
	if i < 0 {
		return false
	}
	rest := help[i+1:]
	if j := strings.Index(rest, "\n  -"); j >= 0 {
		rest = rest[:j]
	}
	return strings.Contains(rest, want)
}
