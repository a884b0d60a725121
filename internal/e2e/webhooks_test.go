package e2e_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// A gateway killed (SIGKILL) while a webhook delivery is in flight: the
// delivery's lease runs out and the restarted gateway sends it again, with
// the same webhook-id and a valid signature. Nothing is lost, on SQLite
// and on PostgreSQL.
func TestWebhookDeliveredAfterKill(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { webhookAfterKill(t, "") })
	t.Run("postgres", func(t *testing.T) { webhookAfterKill(t, storetest.PostgresURL(t)) })
}

func webhookAfterKill(t *testing.T, dbURL string) {
	var (
		mu    sync.Mutex
		hits  []http.Header
		first = make(chan struct{})
		block = make(chan struct{})
	)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Set("X-Body", string(body))
		mu.Lock()
		hits = append(hits, h)
		n := len(hits)
		mu.Unlock()
		if n == 1 {
			close(first)
			<-block // the first attempt never gets an answer
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	t.Cleanup(func() { close(block) })

	serve := []string{"--webhook-allow-hosts", "127.0.0.0/8", "--webhook-lease", "3s"}
	c, gw := newCluster(t, dbURL, serve...)
	body := fmt.Sprintf(`{"url":%q,"events":["run.paused"],"workspace_id":%q}`, rc.URL+"/hook", c.WS)
	res := post(t, gw.URL+"/api/v1/webhooks/endpoints", c.MK, body)
	var created struct {
		Endpoint struct{ ID string } `json:"endpoint"`
		Secret   string              `json:"secret"`
	}
	if err := json.Unmarshal(res, &created); err != nil || created.Secret == "" {
		t.Fatalf("create endpoint: %s", res)
	}

	// Only the delivery is under test here: the row is written through the
	// function the runs code calls, with a run object shaped as it builds
	// one (TestWebhookReceiverAnswersPause uses a real run).
	db := openDB(t, c, dbURL)
	run := `{"id":"run_kill","object":"intern.run","status":"paused","pending_interaction":{"id":"call_1"}}`
	if err := db.RunInTx(context.Background(), nil, func(ctx context.Context, tx bun.Tx) error {
		return webhooks.RunChanged(ctx, tx, c.WS, webhooks.RunPaused, json.RawMessage(run))
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-time.After(wait):
		t.Fatal("the gateway did not attempt the delivery")
	}
	gw.Kill()
	gw = c.Gateway(t, serve...)

	deadline := time.Now().Add(wait)
	for {
		mu.Lock()
		n := len(hits)
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted gateway did not deliver")
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	a, b := hits[0], hits[1]
	mu.Unlock()
	if a.Get("webhook-id") == "" || a.Get("webhook-id") != b.Get("webhook-id") {
		t.Fatalf("webhook-id %q then %q", a.Get("webhook-id"), b.Get("webhook-id"))
	}
	if !signed(created.Secret, b) || !strings.Contains(b.Get("X-Body"), `"run_kill"`) {
		t.Fatalf("redelivery not signed or not the event: %v", b)
	}
	// The log shows it delivered, after two attempts.
	for {
		out := get(t, gw.URL+"/api/v1/webhooks/endpoints/"+created.Endpoint.ID+"/deliveries", c.MK)
		if strings.Contains(string(out), `"status":"succeeded"`) {
			if !strings.Contains(string(out), `"attempts":2`) {
				t.Fatalf("delivery log: %s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivery log: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// signed checks h's signature over its body (X-Body) by hand, as the
// Standard Webhooks specification describes.
func signed(secret string, h http.Header) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + h.Get("X-Body")))
	want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, s := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

func openDB(t *testing.T, c *cluster, dbURL string) *bun.DB {
	t.Helper()
	var db *bun.DB
	var err error
	if dbURL == "" {
		db, err = store.OpenSQLite(context.Background(), filepath.Join(c.dataDir, "cohort.db"))
	} else {
		db, err = store.Open(context.Background(), dbURL, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func post(t *testing.T, url, key, body string) []byte {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

func get(t *testing.T, url, key string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	return do(t, req)
}

func do(t *testing.T, req *http.Request) []byte {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", req.Method, req.URL, res.StatusCode, b)
	}
	return b
}

// A caller that reacts to a pause by webhook, with a real background run:
// a "background": true turn in manual approval mode pauses for approval;
// the gateway announces it (run.paused, the run object with its
// pending_interaction) to a real receiver, which checks the signature by
// hand and answers with the normal tool message; the run goes on in the
// background, run.completed arrives, and GET run shows it completed.
func TestWebhookReceiverAnswersPause(t *testing.T) {
	type runData struct {
		ID                 string `json:"id"`
		InternID           string `json:"intern_id"`
		SessionID          string `json:"session_id"`
		Status             string `json:"status"`
		PendingInteraction struct {
			ID string `json:"id"`
		} `json:"pending_interaction"`
	}
	var secret, gwURL, key string
	var mu sync.Mutex
	var types []string
	completed := make(chan runData, 1)
	fail := make(chan string, 4)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Set("X-Body", string(body))
		if !signed(secret, h) {
			fail <- "bad signature"
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Acknowledge at once, answer after (receivers work asynchronously).
		w.WriteHeader(http.StatusNoContent)
		var ev struct {
			Type string  `json:"type"`
			Data runData `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			fail <- "event " + string(body)
			return
		}
		mu.Lock()
		types = append(types, ev.Type)
		mu.Unlock()
		switch ev.Type {
		case webhooks.RunPaused:
			if ev.Data.Status != "paused" || ev.Data.PendingInteraction.ID == "" || ev.Data.SessionID == "" {
				fail <- "paused event without its pending interaction: " + string(body)
				return
			}
			go func() {
				answer := reply(ev.Data.SessionID, ev.Data.PendingInteraction.ID, "allow_once")
				req, _ := http.NewRequest("POST", gwURL+"/api/v1/interns/"+ev.Data.InternID+"/chat/completions", strings.NewReader(answer))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					fail <- err.Error()
					return
				}
				out, _ := io.ReadAll(res.Body)
				res.Body.Close()
				// A tool message answering a paused background run continues it
				// in the background: 202 and the run.
				if res.StatusCode != http.StatusAccepted || !strings.Contains(string(out), ev.Data.ID) {
					fail <- fmt.Sprintf("answer: %d %s", res.StatusCode, out)
				}
			}()
		case webhooks.RunCompleted:
			completed <- ev.Data
		default:
			fail <- "unexpected event " + string(body)
		}
	}))
	t.Cleanup(rc.Close)

	c, gw := newCluster(t, "", "--webhook-allow-hosts", "127.0.0.0/8")
	gwURL, key = gw.URL, c.WK
	d := c.Daemon(t, c.Demo, nil)
	var created struct {
		Secret string `json:"secret"`
	}
	json.Unmarshal(post(t, gw.URL+"/api/v1/webhooks/endpoints", c.WK,
		fmt.Sprintf(`{"url":%q,"events":["run.paused","run.completed"]}`, rc.URL)), &created)
	secret = created.Secret

	res := chat(t, gw, c.WK, d.id, user("$ echo answered-by-webhook", `"background":true`, `"approval_mode":"manual"`))
	raw, _ := io.ReadAll(res.Body)
	var started runData
	if err := json.Unmarshal(raw, &started); err != nil || res.StatusCode != http.StatusAccepted || started.ID == "" {
		t.Fatalf("start: %d %s", res.StatusCode, raw)
	}
	select {
	case done := <-completed:
		if done.ID != started.ID || done.Status != "completed" {
			t.Fatalf("run.completed for %+v, started %s", done, started.ID)
		}
	case msg := <-fail:
		t.Fatal(msg)
	case <-time.After(3 * wait):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no run.completed; events so far %v, run %v", types, getRun(t, gw, c.WK, d.id, started.ID))
	}
	mu.Lock()
	if len(types) != 2 || types[0] != webhooks.RunPaused {
		t.Fatalf("events %v", types)
	}
	mu.Unlock()
	run := getRun(t, gw, c.WK, d.id, started.ID)
	if run["status"] != "completed" || run["pending_interaction"] != nil {
		t.Fatalf("GET run: %v", run)
	}
	text := ""
	for _, ev := range runEvents(t, gw, c.WK, d.id, started.ID, 0) {
		text += ev.data
	}
	if !strings.Contains(text, "answered-by-webhook") {
		t.Fatalf("the run's output does not show the command ran: %s", text)
	}
}
