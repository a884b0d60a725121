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
