package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// benchEnv is a gateway on db with one endpoint, for every event, at a
// receiver that answers 204 at once.
func benchEnv(b *testing.B, db *bun.DB, got chan<- string) *testenv.Env {
	cfg := testenv.Config()
	cfg.Webhooks.AllowHosts = []string{"127.0.0.0/8"}
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

// counted is db's connection pool behind a handle of its own that counts
// the statements sent through it: give it to the worker, and the count is
// the worker's round trips to the database.
func counted(db *bun.DB) (*bun.DB, *atomic.Int64) {
	n := new(atomic.Int64)
	return bun.NewDB(db.DB, db.Dialect()).WithQueryHook(queryCounter{n}), n
}

type queryCounter struct{ n *atomic.Int64 }

func (q queryCounter) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	q.n.Add(1)
	return ctx
}

func (queryCounter) AfterQuery(context.Context, *bun.QueryEvent) {}

// enqueueN puts n due deliveries in e's outbox.
func enqueueN(b *testing.B, e *testenv.Env, n int) {
	ctx := context.Background()
	for done := 0; done < n; {
		k := min(n-done, 500)
		err := e.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			for range k {
				if err := e.Server.Webhooks.RunChanged(ctx, tx, e.WorkspaceID, webhooks.RunCompleted, json.RawMessage(benchRun)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		done += k
	}
}

// BenchmarkWebhooksThroughput drains an outbox of b.N due deliveries with
// one worker (default batch and concurrency) calling RunOnce until
// nothing is left: deliveries/s, each a claim, a signed POST to a local
// receiver and the recorded answer, and the worker's statements per
// delivery.
func BenchmarkWebhooksThroughput(b *testing.B) {
	benchDBs(b, func(b *testing.B, db *bun.DB) {
		e := benchEnv(b, db, nil)
		ctx := context.Background()
		enqueueN(b, e, b.N)
		wdb, queries := counted(db)
		w := &webhooks.Worker{DB: wdb, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(b)})}
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
		b.ReportMetric(float64(queries.Load())/float64(total), "queries/delivery")
	})
}

// BenchmarkWebhooksThroughputRun is BenchmarkWebhooksThroughput with the
// worker running as in serve (Run), from the first claim to the b.N-th
// recorded answer.
func BenchmarkWebhooksThroughputRun(b *testing.B) {
	benchDBs(b, func(b *testing.B, db *bun.DB) {
		e := benchEnv(b, db, nil)
		enqueueN(b, e, b.N)
		wdb, queries := counted(db)
		var delivered atomic.Int64
		all := make(chan struct{})
		w := &webhooks.Worker{DB: wdb, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(b)}),
			OnDelivered: func(string, time.Time, time.Time) {
				if delivered.Add(1) == int64(b.N) {
					close(all)
				}
			}}
		ctx, cancel := context.WithCancel(context.Background())
		b.ResetTimer()
		start := time.Now()
		go w.Run(ctx)
		select {
		case <-all:
		case <-time.After(5 * time.Minute):
			b.Fatalf("delivered %d of %d", delivered.Load(), b.N)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		<-w.Done()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "deliveries/s")
		b.ReportMetric(float64(queries.Load())/float64(b.N), "queries/delivery")
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
		wdb, queries := counted(db)
		w := &webhooks.Worker{DB: wdb, KEK: e.Server.KEK, Client: webhooks.NewClient(webhooks.ClientOptions{Allow: loopback(b)})}
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
		// Statements per delivery, the idle polls included.
		b.ReportMetric(float64(queries.Load())/float64(b.N), "queries/delivery")
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
	})
}
