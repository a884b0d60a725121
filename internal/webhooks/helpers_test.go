package webhooks_test

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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
	"github.com/uptrace/bun"
)

// verify is the receiver's check, written from the Standard Webhooks
// specification independently of the package's signer: the key is the
// base64 after "whsec_", the signed content id.timestamp.body, and the
// header holds space-separated "v1,<base64>" entries of which one must
// match.
func verify(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("missing headers: id %q timestamp %q signature %q", id, ts, sigs)
	}
	if _, err := strconv.ParseInt(ts, 10, 64); err != nil {
		return fmt.Errorf("timestamp %q", ts)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		v, b64, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no signature matches")
}

// hit is one request a receiver got.
type hit struct {
	ID, Timestamp, Signature string
	Body                     []byte
}

// receiver is a real HTTP server that answers with what answer returns
// for each request (the n-th, from 1).
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	hits []hit
}

func newReceiver(t testing.TB, answer func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.hits = append(rc.hits, hit{r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), b})
		n := len(rc.hits)
		rc.mu.Unlock()
		if answer == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		answer(n, w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) Hits() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

// headers rebuilds a hit's headers for verify.
func (h hit) headers() http.Header {
	hd := http.Header{}
	hd.Set("webhook-id", h.ID)
	hd.Set("webhook-timestamp", h.Timestamp)
	hd.Set("webhook-signature", h.Signature)
	return hd
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().UTC().Truncate(time.Second).Add(time.Second)} }
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// loopback lets the package reach the test's receivers.
func loopback(t testing.TB) *safehttp.Allowlist {
	a, err := safehttp.ParseAllowlist([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newEnv is a gateway whose webhooks reach loopback receivers, with the
// service on clk.
func newEnv(t *testing.T, db *bun.DB, clk *clock) *testenv.Env {
	cfg := testenv.Config()
	cfg.Webhooks.AllowHosts = []string{"127.0.0.0/8"}
	e := testenv.NewConfig(t, db, cfg)
	if clk != nil {
		e.Server.Webhooks.Now = clk.Now
	}
	return e
}

// worker is a delivery worker on e's database and KEK, on clk, with no
// jitter.
func worker(t testing.TB, e *testenv.Env, clk *clock) *webhooks.Worker {
	w := &webhooks.Worker{DB: e.DB, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(t)}),
		Jitter: func() float64 { return 1 }}
	if clk != nil {
		w.Now = clk.Now
	}
	return w
}

// createEndpoint registers url for events through the REST door with the
// workspace key and returns the id and the secret.
func createEndpoint(t testing.TB, e *testenv.Env, url string, events ...string) (string, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"url": url, "events": events, "description": "test"})
	st, body, _ := e.Do(t, "POST", "/webhooks/endpoints", e.WorkspaceKey, "application/json", string(b))
	if st != http.StatusCreated {
		t.Fatalf("create endpoint: %d %s", st, body)
	}
	var res struct {
		Endpoint struct{ ID string } `json:"endpoint"`
		Secret   string              `json:"secret"`
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if res.Endpoint.ID == "" || !strings.HasPrefix(res.Secret, "whsec_") {
		t.Fatalf("create endpoint: %s", body)
	}
	return res.Endpoint.ID, res.Secret
}

// fire enqueues an event in a transaction, as the runs code does.
func fire(t testing.TB, e *testenv.Env, ws, event, run string) {
	t.Helper()
	err := e.DB.RunInTx(context.Background(), nil, func(ctx context.Context, tx bun.Tx) error {
		return e.Server.Webhooks.RunChanged(ctx, tx, ws, event, json.RawMessage(run))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// delivery reads one outbox row.
func delivery(t testing.TB, db *bun.DB, id string) store.WebhookDelivery {
	t.Helper()
	var d store.WebhookDelivery
	if err := db.NewSelect().Model(&d).Where("id = ?", id).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}
