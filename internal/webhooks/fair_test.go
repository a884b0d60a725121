package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// One workspace's slow receivers delay only that workspace (issue 36, row
// 5). Workspace A has 20 endpoints (the most it may have) that answer
// after 3 s, with attempts timing out at 2 s, and 100 deliveries due to
// them; workspace B's receiver answers at once. While A's are in flight,
// B's events go out within 2 s (p99), and A never holds more than its
// bound of the worker's attempts.
func TestSlowWorkspaceDoesNotDelayAnother(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, nil)
		ctx := context.Background()

		var inFlight, peak atomic.Int32
		slow := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			c := inFlight.Add(1)
			defer inFlight.Add(-1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			select {
			case <-time.After(3 * time.Second):
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusNoContent)
		})
		for i := range 20 {
			createEndpoint(t, e, fmt.Sprintf("%s/%d", slow.URL, i), webhooks.RunCompleted)
		}

		var mu sync.Mutex
		arrived := map[string]time.Time{}
		fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var ev struct {
				Data struct{ ID string } `json:"data"`
			}
			json.Unmarshal(b, &ev)
			mu.Lock()
			if _, ok := arrived[ev.Data.ID]; !ok {
				arrived[ev.Data.ID] = time.Now()
			}
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(fast.Close)
		ws, err := e.Server.Workspaces.Create(ctx, e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: new("fast"), Slug: new("fast")})
		if err != nil {
			t.Fatal(err)
		}
		createEndpointWith(t, e, e.NewKey(t, "workspace", ws.GetId()), fast.URL, webhooks.RunCompleted)

		for i := range 5 {
			fire(t, e, e.WorkspaceID, webhooks.RunCompleted, fmt.Sprintf(`{"id":"run_slow_%d"}`, i))
		}
		w := worker(t, e, nil)
		w.Client = webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(t), Timeout: 2 * time.Second})
		rctx, cancel := context.WithCancel(ctx)
		go w.Run(rctx)
		t.Cleanup(func() { cancel(); <-w.Done() })
		// Let A's deliveries take the worker first.
		for deadline := time.Now().Add(5 * time.Second); inFlight.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if inFlight.Load() == 0 {
			t.Fatal("the slow workspace's deliveries were not attempted")
		}

		const events = 20
		fired := map[string]time.Time{}
		for i := range events {
			id := fmt.Sprintf("run_fast_%d", i)
			fired[id] = time.Now()
			fire(t, e, ws.GetId(), webhooks.RunCompleted, `{"id":"`+id+`"}`)
			w.Wake() // as the runs code does after its transaction
			time.Sleep(100 * time.Millisecond)
		}
		const limit = 10 * time.Second
		for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			n := len(arrived)
			mu.Unlock()
			if n == events {
				break
			}
		}
		var delays []time.Duration
		mu.Lock()
		for id, t0 := range fired {
			d := limit // not delivered within the limit
			if at, ok := arrived[id]; ok {
				d = at.Sub(t0)
			}
			delays = append(delays, d)
		}
		mu.Unlock()
		slices.Sort(delays)
		p50, p99 := delays[len(delays)/2], delays[(len(delays)*99+99)/100-1]
		t.Logf("fast workspace: p50 %v, p99 %v; slow workspace: at most %d in flight", p50, p99, peak.Load())
		if p99 > 2*time.Second {
			t.Fatalf("a slow workspace delayed another's deliveries: p99 %v (p50 %v), want ≤ 2s", p99, p50)
		}
		if p := peak.Load(); p > webhooks.DefaultPerWorkspace {
			t.Fatalf("the slow workspace had %d attempts in flight at once, bound %d", p, webhooks.DefaultPerWorkspace)
		}

		// A's attempts ended at the attempt timeout and wait for a retry.
		var rows []store.WebhookDelivery
		if err := db.NewSelect().Model(&rows).Where("workspace_id = ? AND attempts > 0 AND lease_owner IS NULL", e.WorkspaceID).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			t.Fatal("no attempt of the slow workspace was recorded")
		}
		for _, d := range rows {
			if d.Status != store.WebhookPending || d.LastError != "timed out" {
				t.Fatalf("slow delivery: %+v", d)
			}
		}
	})
}

// The worker bounds an attempt by its own timeout, whatever the client's.
func TestAttemptTimeout(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, nil)
		rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(10 * time.Second):
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusOK)
		})
		createEndpoint(t, e, rc.URL, webhooks.RunCompleted)
		fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"run_1"}`)
		w := worker(t, e, nil)
		w.AttemptTimeout = 300 * time.Millisecond
		start := time.Now()
		if n, err := w.RunOnce(context.Background()); n != 1 || err != nil {
			t.Fatalf("run: %d %v", n, err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("the attempt took %v", took)
		}
		d := delivery(t, db, rc.Hits()[0].ID)
		if d.Status != store.WebhookPending || d.LastError != "timed out" || d.Attempts != 1 {
			t.Fatalf("after a timed out attempt: %+v", d)
		}
	})
}

// createEndpointWith is createEndpoint with another workspace's key.
func createEndpointWith(t testing.TB, e *testenv.Env, key, url string, events ...string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"url": url, "events": events})
	st, body, _ := e.Do(t, "POST", "/webhooks/endpoints", key, "application/json", string(b))
	if st != http.StatusCreated || !strings.Contains(body, `"secret":"whsec_`) {
		t.Fatalf("create endpoint: %d %s", st, body)
	}
	var res struct {
		Endpoint struct{ ID string } `json:"endpoint"`
	}
	json.Unmarshal([]byte(body), &res)
	return res.Endpoint.ID
}
