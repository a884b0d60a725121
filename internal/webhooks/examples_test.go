package webhooks_test

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// The receivers docs/webhooks.md shows, in Go and in TypeScript, run as
// processes: each accepts a real signed delivery (recorded as succeeded)
// and refuses a forged one with 401.
func TestDocumentedReceivers(t *testing.T) {
	dir := t.TempDir()
	goBin := filepath.Join(dir, "receiver-go")
	if out, err := exec.Command("go", "build", "-o", goBin, "../../docs/examples/webhooks/go").CombinedOutput(); err != nil {
		t.Fatalf("build the Go receiver: %v\n%s", err, out)
	}
	t.Run("go", func(t *testing.T) { checkReceiver(t, goBin) })
	t.Run("typescript", func(t *testing.T) {
		tsc, err := filepath.Abs("../../web/node_modules/.bin/tsc")
		if err != nil {
			t.Fatal(err)
		}
		node, nerr := exec.LookPath("node")
		if _, err := os.Stat(tsc); err != nil || nerr != nil {
			t.Skip("!!! SKIPPING: needs node and web/node_modules (cd web && npm ci)")
		}
		out := filepath.Join(dir, "ts")
		if b, err := exec.Command(tsc, "--target", "es2022", "--module", "nodenext", "--noCheck", "--outDir", out, "../../docs/examples/webhooks/ts/receiver.ts").CombinedOutput(); err != nil {
			t.Fatalf("compile the TypeScript receiver: %v\n%s", err, b)
		}
		checkReceiver(t, node, filepath.Join(out, "receiver.js"))
	})
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

func checkReceiver(t *testing.T, argv ...string) {
	e := newEnv(t, storetest.SQLite(t), nil)
	// The endpoint first, for its secret; then the receiver, then its URL.
	_, secret := createEndpoint(t, e, "http://127.0.0.1:9/placeholder", webhooks.RunPaused)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "WEBHOOK_SECRET="+secret, "LISTEN=127.0.0.1:0")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	var url string
	for url == "" && sc.Scan() {
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		t.Fatal("the receiver did not say where it listens")
	}
	lines := make(chan string, 4)
	go func() {
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	if _, err := e.DB.NewUpdate().Table("webhook_endpoints").Set("url = ?", url+"/hook").Where("1 = 1").Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	fire(t, e, e.WorkspaceID, webhooks.RunPaused, `{"id":"run_doc","object":"intern.run","status":"paused","pending_interaction":{"id":"call_doc"}}`)
	if n, err := worker(t, e, nil).RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("deliver: %d %v", n, err)
	}
	var status string
	var code int
	e.DB.NewRaw("SELECT status, last_status_code FROM webhook_deliveries").Scan(context.Background(), &status, &code)
	if status != "succeeded" || code != http.StatusNoContent {
		t.Fatalf("delivery %s %d", status, code)
	}
	if l := <-lines; !strings.Contains(l, "run.paused") || !strings.Contains(l, "run_doc") {
		t.Fatalf("receiver printed %q", l)
	}
	req, _ := http.NewRequest("POST", url+"/hook", strings.NewReader(`{"type":"run.paused","data":{}}`))
	req.Header.Set("webhook-id", "msg_forged")
	req.Header.Set("webhook-timestamp", "1614265330")
	req.Header.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged delivery: %d", res.StatusCode)
	}
}
