package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// The Standard Webhooks published test vector (libraries' TestWebhookSign):
// the package's signer and the tests' independent verifier both agree
// with it.
func TestSignatureMatchesPublishedVector(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const id = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	body := []byte(`{"test": 2432232314}`)
	key, err := webhooks.SecretKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	if got := webhooks.Sign(key, id, time.Unix(1614265330, 0), body); got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= "+want)
	if err := verify(secret, h, body); err != nil {
		t.Fatalf("verifier refuses the published vector: %v", err)
	}
	h.Set("webhook-signature", want)
	if err := verify(secret, h, []byte(`{"test": 2432232315}`)); err == nil {
		t.Fatal("verifier accepts a changed body")
	}
	// A new secret is whsec_ and 32 random bytes.
	s, err := webhooks.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if k, err := webhooks.SecretKey(s); err != nil || len(k) != 32 || !strings.HasPrefix(s, "whsec_") {
		t.Fatalf("new secret %d bytes: %v", len(k), err)
	}
}

// A receiver that fails, then answers: the delivery is retried on the
// schedule with the same webhook-id and body, every attempt signed, and
// the log shows each step.
func TestDeliveryRetriedUntilAccepted(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		clk := newClock()
		e := newEnv(t, db, clk)
		rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				http.Error(w, "busy", http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusOK)
		})
		ep, secret := createEndpoint(t, e, rc.URL+"/hook", webhooks.RunPaused, webhooks.RunCompleted)
		run := `{"id":"run_1","object":"run","status":"paused","interaction":{"id":"call_1","type":"approval"}}`
		fire(t, e, e.WorkspaceID, webhooks.RunPaused, run)
		fire(t, e, e.WorkspaceID, webhooks.RunFailed, `{"id":"run_2"}`) // not subscribed
		w := worker(t, e, clk)
		ctx := context.Background()

		if n, err := w.RunOnce(ctx); n != 1 || err != nil {
			t.Fatalf("first pass: %d %v", n, err)
		}
		hits := rc.Hits()
		if len(hits) != 1 {
			t.Fatalf("%d requests", len(hits))
		}
		d := delivery(t, db, hits[0].ID)
		if d.Status != store.WebhookPending || d.Attempts != 1 || d.LastStatusCode != 500 || !strings.Contains(d.LastError, "busy") {
			t.Fatalf("after a 500: %+v", d)
		}
		if got := d.NextAttemptAt.Sub(clk.Now()); got != webhooks.DefaultSchedule[0] {
			t.Fatalf("next attempt in %v, want %v", got, webhooks.DefaultSchedule[0])
		}
		// Not due yet.
		if n, _ := w.RunOnce(ctx); n != 0 {
			t.Fatalf("attempted %d before the next attempt was due", n)
		}
		clk.Add(webhooks.DefaultSchedule[0])
		if n, err := w.RunOnce(ctx); n != 1 || err != nil {
			t.Fatalf("second pass: %d %v", n, err)
		}
		hits = rc.Hits()
		if len(hits) != 2 || hits[1].ID != hits[0].ID || string(hits[1].Body) != string(hits[0].Body) {
			t.Fatalf("retry differs: %+v", hits)
		}
		for _, h := range hits {
			if err := verify(secret, h.headers(), h.Body); err != nil {
				t.Fatalf("attempt not signed: %v", err)
			}
		}
		var ev struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(hits[0].Body, &ev); err != nil || ev.Type != webhooks.RunPaused || string(ev.Data) != run {
			t.Fatalf("body %s: %v", hits[0].Body, err)
		}
		st, body, _ := e.Do(t, "GET", "/webhooks/endpoints/"+ep+"/deliveries", e.WorkspaceKey, "", "")
		if st != 200 || !strings.Contains(body, `"status":"succeeded"`) || !strings.Contains(body, `"attempts":2`) || strings.Count(body, `"event_type"`) != 1 {
			t.Fatalf("delivery log: %d %s", st, body)
		}

		// Redelivery sends it again, same id, fresh schedule.
		st, body, _ = e.Do(t, "POST", "/webhooks/deliveries/"+hits[0].ID+"/redeliver", e.WorkspaceKey, "", "")
		if st != 200 || !strings.Contains(body, `"status":"pending"`) {
			t.Fatalf("redeliver: %d %s", st, body)
		}
		if n, err := w.RunOnce(ctx); n != 1 || err != nil {
			t.Fatalf("redelivery pass: %d %v", n, err)
		}
		if hits = rc.Hits(); len(hits) != 3 || hits[2].ID != hits[0].ID {
			t.Fatalf("redelivery: %+v", hits)
		}
	})
}

// Retry-After pushes the next attempt past the schedule, in seconds or as
// an HTTP date; an attempt the schedule runs out on fails the delivery.
func TestRetryAfterAndGivingUp(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		clk := newClock()
		e := newEnv(t, db, clk)
		answer := "3600"
		rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", answer)
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		createEndpoint(t, e, rc.URL, webhooks.RunCompleted)
		fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"run_1"}`)
		w := worker(t, e, clk)
		w.Schedule = []time.Duration{time.Second, time.Second}
		ctx := context.Background()
		w.RunOnce(ctx)
		id := rc.Hits()[0].ID
		if got := delivery(t, db, id).NextAttemptAt.Sub(clk.Now()); got != time.Hour {
			t.Fatalf("Retry-After 3600: next attempt in %v", got)
		}
		clk.Add(time.Hour)
		answer = clk.Now().Add(2 * time.Hour).Format(http.TimeFormat)
		w.RunOnce(ctx)
		if got := delivery(t, db, id).NextAttemptAt.Sub(clk.Now()); got != 2*time.Hour {
			t.Fatalf("Retry-After date: next attempt in %v", got)
		}
		clk.Add(2 * time.Hour)
		w.RunOnce(ctx)
		d := delivery(t, db, id)
		if d.Status != store.WebhookFailed || d.Attempts != 3 || d.LastStatusCode != 503 {
			t.Fatalf("after the schedule: %+v", d)
		}
		clk.Add(24 * time.Hour)
		if n, _ := w.RunOnce(ctx); n != 0 || len(rc.Hits()) != 3 {
			t.Fatalf("a failed delivery was attempted again")
		}
	})
}

// Two workers racing over one outbox deliver every event exactly once
// (no crash, so no lease runs out).
func TestRacingWorkersDeliverOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, nil)
		rc := newReceiver(t, nil)
		createEndpoint(t, e, rc.URL, webhooks.EventTypes...)
		const events = 60
		for i := range events {
			fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"run_`+string(rune('a'+i%26))+`"}`)
		}
		ctx := context.Background()
		var wg sync.WaitGroup
		for range 2 {
			w := worker(t, e, nil)
			w.Batch = 4
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n, err := w.RunOnce(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					if n == 0 {
						return
					}
				}
			}()
		}
		wg.Wait()
		seen := map[string]int{}
		for _, h := range rc.Hits() {
			seen[h.ID]++
		}
		if len(seen) != events {
			t.Fatalf("%d distinct deliveries, want %d", len(seen), events)
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("%s delivered %d times", id, n)
			}
		}
	})
}

// A worker that claimed a delivery and died (its lease never released;
// the kill of a real gateway is internal/e2e's TestWebhookDeliveredAfterKill)
// leaves it to another worker once the lease runs out, not before.
func TestExpiredLeaseIsTakenOver(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		clk := newClock()
		e := newEnv(t, db, clk)
		rc := newReceiver(t, nil)
		createEndpoint(t, e, rc.URL, webhooks.RunCancelled)
		fire(t, e, e.WorkspaceID, webhooks.RunCancelled, `{"id":"run_1"}`)
		// The dead worker's claim, as its claim statement leaves it.
		if _, err := db.NewUpdate().Table("webhook_deliveries").
			Set("lease_owner = ?, lease_until = ?, attempts = attempts + 1", "wk_dead", clk.Now().Add(webhooks.DefaultLease)).
			Where("1 = 1").Exec(context.Background()); err != nil {
			t.Fatal(err)
		}
		other := worker(t, e, clk)
		if n, _ := other.RunOnce(context.Background()); n != 0 {
			t.Fatal("a leased delivery was taken before its lease ran out")
		}
		clk.Add(webhooks.DefaultLease)
		if n, err := other.RunOnce(context.Background()); n != 1 || err != nil {
			t.Fatalf("after the lease: %d %v", n, err)
		}
		hits := rc.Hits()
		d := delivery(t, db, hits[0].ID)
		if len(hits) != 1 || d.Status != store.WebhookSucceeded || d.Attempts != 2 {
			t.Fatalf("takeover: %d hits, %+v", len(hits), d)
		}
	})
}

// A worker stopped while a delivery is in flight finishes and records it
// before Run returns: a graceful stop sends nothing twice.
func TestGracefulStopFinishesTheBatch(t *testing.T) {
	db := storetest.SQLite(t)
	e := newEnv(t, db, nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusOK)
	})
	createEndpoint(t, e, rc.URL, webhooks.RunCompleted)
	fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"run_1"}`)
	w := worker(t, e, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go w.Run(ctx)
	<-arrived
	cancel()
	close(release)
	<-w.Done()
	d := delivery(t, db, rc.Hits()[0].ID)
	if d.Status != store.WebhookSucceeded || d.LeaseOwner != nil || len(rc.Hits()) != 1 {
		t.Fatalf("after a graceful stop: %+v", d)
	}
}

// The delivery log is bounded: finished deliveries older than the
// retention are deleted, pending ones never.
func TestPruneKeepsPending(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		clk := newClock()
		e := newEnv(t, db, clk)
		rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/fail" {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
		})
		createEndpoint(t, e, rc.URL+"/ok", webhooks.RunCompleted)
		createEndpoint(t, e, rc.URL+"/fail", webhooks.RunCompleted)
		fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"run_old"}`)
		w := worker(t, e, clk)
		w.Retention = time.Hour
		w.RunOnce(context.Background()) // one succeeds, one is pending again
		clk.Add(2 * time.Hour)
		if n, err := w.Prune(context.Background()); n != 1 || err != nil {
			t.Fatalf("pruned %d: %v", n, err)
		}
		var left []store.WebhookDelivery
		db.NewSelect().Model(&left).Scan(context.Background())
		if len(left) != 1 || left[0].Status != store.WebhookPending {
			t.Fatalf("left %+v", left)
		}
	})
}
