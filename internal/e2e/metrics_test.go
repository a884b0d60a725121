package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A real Prometheus scrapes a real gateway that served chat turns, a
// pause, a token exchange and a vault write; its query API shows each.
func TestPrometheusScrapesTheGateway(t *testing.T) {
	t.Parallel()
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("prometheus is not installed (.ci/run installs Debian's)")
		}
		t.Skip("SKIPPING: prometheus is not installed")
	}
	metricsAddr := freePort(t)
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.Gateway(t, "--provisioner", "local", "--metrics-listen", metricsAddr, "--webhook-allow-hosts", "127.0.0.0/8")
	c.load(t)
	// Two receivers of run events: one that answers, and one that
	// refuses connections (its failed attempt is counted and logged).
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(rc.Close)
	for _, u := range []string{rc.URL + "/hook", "http://" + freePort(t) + "/refused"} {
		post(t, gw.URL+"/api/v1/webhooks/endpoints", c.MK, fmt.Sprintf(`{"url":%q,"events":["run.completed"],"workspace_id":%q}`, u, c.WS))
	}

	// The API port serves no metrics.
	if res, err := http.Get(gw.URL + "/metrics"); err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), "cohort_http_requests_total") {
			t.Fatal("metrics on the API port")
		}
	}

	testutil.Eventually(t, wait, "the demo intern answers", func() bool {
		res := chat(t, gw, c.WK, c.Demo, user("hello metrics"))
		ok := res.StatusCode == 200
		readAll(t, res)
		return ok
	})
	p := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ echo paused", `"approval_mode":"manual"`)))
	if p.Finish != "tool_calls" {
		t.Fatalf("no pause: %q", p.Finish)
	}
	req, _ := http.NewRequest("PUT", gw.URL+"/api/v1/vault/interns/"+c.Demo+"/secrets/metrics_token",
		strings.NewReader(`{"hosts":["api.example.com"],"value":"v"}`))
	req.Header.Set("Authorization", "Bearer "+c.WK)
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 201 {
		t.Fatalf("vault put: %v %v", err, res)
	}
	// An exchange refused at the algorithm check (alg none): audited and counted.
	keys, _ := c.admin("key", "list", "--org", c.Org, "--json")
	var list []map[string]any
	json.Unmarshal(keys, &list)
	keyID := ""
	for _, k := range list {
		if k["kind"] == "workspace" {
			keyID, _ = k["id"].(string)
		}
	}
	iss := c.Admin(t, "federation", "issuer-create", "--org", c.Org, "--name", "idp", "--issuer-url", "https://idp.example")
	issID, _ := iss["id"].(string)
	pol := c.Admin(t, "federation", "policy-create", "--org", c.Org, "--issuer", issID, "--audience", "cohort", "--api-key", keyID, "--subject", "s")
	polID, _ := pol["id"].(string)
	none := `eyJhbGciOiJub25lIiwia2lkIjoiayJ9.eyJzdWIiOiJzIn0.`
	form := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
		"subject_token_type": {"urn:ietf:params:oauth:token-type:jwt"}, "subject_token": {none}, "federation_policy_id": {polID}}
	if res, err := http.PostForm(gw.URL+"/api/v1/oauth/token", form); err != nil || res.StatusCode != 400 {
		t.Fatalf("exchange: %v %v", err, res)
	}

	// A background run, to its end.
	bg := chat(t, gw, c.WK, c.Demo, user("hello in the background", `"background":true`))
	var run map[string]any
	json.NewDecoder(bg.Body).Decode(&run)
	bg.Body.Close()
	if bg.StatusCode != 202 {
		t.Fatalf("background: %d %v", bg.StatusCode, run)
	}
	testutil.Eventually(t, wait, "the background run completes", func() bool {
		return getRun(t, gw, c.WK, c.Demo, run["id"].(string))["status"] == "completed"
	})
	testutil.Eventually(t, wait, "a failed webhook attempt is logged", func() bool {
		return strings.Contains(gw.stderr.String(), "webhook delivery attempt failed")
	})

	promAddr := freePort(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: cohort\n    static_configs:\n      - targets: ['%s']\n", metricsAddr)), 0o644)
	cmd := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var perr testutil.SyncBuffer
	cmd.Stderr = &perr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan string, 1)
	go func() { cmd.Wait(); ended <- cmd.ProcessState.String() }()
	t.Cleanup(func() {
		var status, how string
		select {
		case status = <-ended:
			how = "on its own, before the test stopped it"
		default:
			cmd.Process.Kill()
			status, how = <-ended, "stopped by the test"
		}
		// How Prometheus ended (while the test ran, or at its end) and its log, for a failure.
		if t.Failed() {
			t.Logf("prometheus (pid %d): %s (%s); stderr:\n%s", cmd.Process.Pid, status, how, tail(perr.String(), 4000))
		}
	})

	query := func(q string) float64 {
		res, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return -1
		}
		defer res.Body.Close()
		var out struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(res.Body).Decode(&out) != nil || len(out.Data.Result) == 0 {
			return -1
		}
		var v float64
		fmt.Sscan(fmt.Sprint(out.Data.Result[0].Value[1]), &v)
		return v
	}
	for q, atLeast := range map[string]float64{
		`sum(cohort_chat_runs_total{outcome="stop"})`:                                                            1,
		`sum(cohort_chat_runs_total{outcome="paused"})`:                                                          1,
		`sum(cohort_chat_first_chunk_seconds_count)`:                                                             2,
		`sum(cohort_http_requests_total{route="POST /api/v1/interns/{internId}/chat/completions",status="200"})`: 2,
		`sum(cohort_vault_operations_total{operation="write",outcome="stored"})`:                                 1,
		`sum(cohort_federation_exchanges_total{outcome="refused",failed_check="algorithm"})`:                     1,
		`sum(cohort_interns{state="running"})`:                                                                   1,
		`sum(go_goroutines{job="cohort"})`:                                                                       1,
		`sum(cohort_background_runs_started_total)`:                                                              1,
		`sum(cohort_background_runs_ended_total{status="completed"})`:                                            1,
		`sum(cohort_background_run_duration_seconds_count)`:                                                      1,
		`sum(cohort_background_run_events_total)`:                                                                2,
		`sum(cohort_background_runs{status="running"}) + 1`:                                                      1,
		`sum(cohort_webhook_attempts_total{outcome="succeeded"})`:                                                1,
		`sum(cohort_webhook_attempts_total{outcome="retry"})`:                                                    1,
		`sum(cohort_webhook_attempt_seconds_count)`:                                                              2,
		`sum(cohort_webhook_deliveries_pending)`:                                                                 1,
		`sum(cohort_webhook_oldest_pending_seconds) + 1`:                                                         1,
	} {
		deadline := time.Now().Add(wait)
		for {
			if v := query(q); v >= atLeast {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s stayed below %v (got %v)\nprometheus: %s", q, atLeast, query(q), tail(perr.String(), 2000))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
