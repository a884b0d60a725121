package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/storetest"
	"github.com/cohort-dev/cohort/internal/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// benchEnv is a gateway on db with one endpoint, for every event, at a
// receiver that answers 204 at once.
func benchEnv(b *testing.B, db *bun.DB, got chan<- string) *testenv.Env {
	cfg := testenv.Config()
	cfg.WebhookAllowHosts = []string{"127.0.0.0/8"}
	e := testenv.NewConfig(b, db, cfg)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if got != nil {
			got <- r.Header.Get("webhook-id")
		}
	}))
	b.Cleanup(rc.Close)
	createEndpoint(b, e, rc.URL, webhooks.EventTypes...)
	return e
}

const benchRun = `{"id":"run_0123456789","object":"run","status":"completed","session_id":"sess_0123456789","usage":{"prompt_tokens":1200,"completion_tokens":340,"total_tokens":1540}}`

func benchDBs(b *testing.B, fn func(b *testing.B, db *bun.DB)) {
	b.Run("sqlite", func(b *testing.B) { fn(b, storetest.SQLite(b)) })
	b.Run("postgres", func(b *testing.B) { fn(b, storetest.Postgres(b)) })
}

// BenchmarkWebhooksThroughput drains an outbox of b.N due deliveries with
// one worker (default batch and concurrency): deliveries/s, each a claim,
// a signed POST to a local receiver and the recorded answer.
func BenchmarkWebhooksThroughput(b *testing.B) {
	benchDBs(b, func(b *testing.B, db *bun.DB) {
		e := benchEnv(b, db, nil)
		ctx := context.Background()
		for done := 0; done < b.N; {
			n := min(b.N-done, 500)
			err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				for range n {
					if err := e.Server.Webhooks.RunChanged(ctx, tx, e.WorkspaceID, webhooks.RunCompleted, json.RawMessage(benchRun)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			done += n
		}
		w := &webhooks.Worker{DB: db, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(b)})}
		b.ResetTimer()
		start := time.Now()
		total := 0
		for {
			n, err := w.RunOnce(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			total += n
		}
		b.StopTimer()
		if total != b.N {
			b.Fatalf("delivered %d of %d", total, b.N)
		}
		b.ReportMetric(float64(total)/time.Since(start).Seconds(), "deliveries/s")
	})
}

// BenchmarkWebhooksLatency is one event at a time, from the transaction
// that enqueues it (then Wake, as the runs code does after it commits) to
// the receiver's answer, with the worker running as in serve: p50 and p99.
func BenchmarkWebhooksLatency(b *testing.B) {
	benchDBs(b, func(b *testing.B, db *bun.DB) {
		got := make(chan string, 1)
		e := benchEnv(b, db, got)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w := &webhooks.Worker{DB: db, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(b)})}
		go w.Run(ctx)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				return e.Server.Webhooks.RunChanged(ctx, tx, e.WorkspaceID, webhooks.RunCompleted, json.RawMessage(benchRun))
			})
			if err != nil {
				b.Fatal(err)
			}
			w.Wake()
			<-got
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
	})
}
