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
	"github.com/cohort-dev/cohort/internal/storetest"
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

	// The runs code enqueues in its own transaction; this test writes the
	// same row through the same function, on the gateway's database.
	db := openDB(t, c, dbURL)
	run := `{"id":"run_kill","status":"paused","interaction":{"id":"call_1"}}`
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

// A caller that reacts to a pause by webhook: a run paused for approval is
// announced (run.paused, carrying the pending interaction) to a real
// receiver, which checks the signature by hand and answers the
// interaction with the normal tool-message chat request; the run goes on
// to its end. Until the runs code announces pauses itself, the test
// enqueues the event as it will, with the run object built from the
// paused stream.
func TestWebhookReceiverAnswersPause(t *testing.T) {
	var secret string
	var gwURL, key string
	result := make(chan *stream, 1)
	fail := make(chan string, 1)
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
			Type string `json:"type"`
			Data struct {
				InternID    string          `json:"intern_id"`
				SessionID   string          `json:"session_id"`
				Interaction json.RawMessage `json:"interaction"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.Type != webhooks.RunPaused {
			fail <- "event " + string(body)
			return
		}
		var call struct {
			ID string `json:"id"`
		}
		json.Unmarshal(ev.Data.Interaction, &call)
		answer := `{"stream":true,"session_id":"` + ev.Data.SessionID + `","messages":[` +
			`{"role":"assistant","content":null,"tool_calls":[` + string(ev.Data.Interaction) + `]},` +
			`{"role":"tool","tool_call_id":"` + call.ID + `","content":"allow_once"}]}`
		go func() {
			result <- readAll(t, chat(t, &proc{URL: gwURL}, key, ev.Data.InternID, answer))
		}()
	}))
	t.Cleanup(rc.Close)

	c, gw := newCluster(t, "", "--webhook-allow-hosts", "127.0.0.0/8")
	gwURL, key = gw.URL, c.WK
	d := c.Daemon(t, c.Demo, nil)
	var created struct {
		Secret string `json:"secret"`
	}
	json.Unmarshal(post(t, gw.URL+"/api/v1/webhooks/endpoints", c.WK, fmt.Sprintf(`{"url":%q,"events":["run.paused"]}`, rc.URL)), &created)
	secret = created.Secret

	s := readAll(t, chat(t, gw, c.WK, d.id, user("$ echo answered-by-webhook", `"approval_mode":"manual"`)))
	if s.Finish != "tool_calls" {
		t.Fatalf("pause: %q", s.Finish)
	}
	interaction, _ := json.Marshal(s.ToolCall)
	run, _ := json.Marshal(map[string]any{"id": "run_pause", "object": "run", "status": "paused", "intern_id": d.id,
		"session_id": s.Session, "interaction": json.RawMessage(interaction)})
	db := openDB(t, c, "")
	if err := db.RunInTx(context.Background(), nil, func(ctx context.Context, tx bun.Tx) error {
		return webhooks.RunChanged(ctx, tx, c.WS, webhooks.RunPaused, run)
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-result:
		if r.Finish != "stop" || !strings.Contains(r.Text, "answered-by-webhook") {
			t.Fatalf("the run after the webhook's answer: %q %q", r.Finish, r.Text)
		}
	case msg := <-fail:
		t.Fatal(msg)
	case <-time.After(wait):
		t.Fatal("no webhook arrived")
	}
}
