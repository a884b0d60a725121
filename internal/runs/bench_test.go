package runs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

func benchDBs(b *testing.B, fn func(b *testing.B, db func(testing.TB) *bun.DB)) {
	b.Run("sqlite", func(b *testing.B) { fn(b, storetest.SQLite) })
	b.Run("postgres", func(b *testing.B) { fn(b, storetest.Postgres) })
}

// BenchmarkRunsStart measures a background start through the REST door
// (the 202 comes once the daemon started the run and its first chunk is
// recorded), against a real daemon and the built-in agent on the offline
// model: ns/op, and p50/p99 of the requests.
func BenchmarkRunsStart(b *testing.B) {
	benchDBs(b, func(b *testing.B, open func(testing.TB) *bun.DB) {
		f := newFixture(b, open(b), func(c *runs.Config) { c.MaxRunning = 1 << 20 })
		f.e.Server.Chat.Limiter = nil
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			t0 := time.Now()
			st, out, _ := f.do(b, "POST", "/interns/"+f.e.InternID+"/chat/completions", f.e.WorkspaceKey, bg(fmt.Sprintf("hello %d", i)))
			lat = append(lat, time.Since(t0))
			if st != http.StatusAccepted {
				b.Fatalf("%d %s", st, out)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	})
}

// storedRun records a completed run of n text chunks (of the demo's size)
// as a recording gateway would have, and returns its id and the chunks'
// JSON bytes.
func storedRun(tb testing.TB, db *bun.DB, intern *store.Intern, n int) (string, int64) {
	ctx := context.Background()
	now := time.Now().UTC()
	id := fmt.Sprintf("run_bench_%d", rand.Int64())
	evs := make([]store.RunEvent, 0, n)
	var size int64
	text := "a delta of about forty bytes of text ok "
	for i := range n {
		c := &cohortv1.ChatCompletionChunk{Id: "chatcmpl-0123456789abcdefghijklmn", Object: "chat.completion.chunk", Created: now.Unix(),
			Model: "cohort/demo", Choices: []*cohortv1.ChatChoice{{Delta: &cohortv1.ChatDelta{Content: &text}}}}
		d := string(sse.AppendChunk(nil, c))
		size += int64(len(d))
		evs = append(evs, store.RunEvent{RunID: id, Seq: int64(i + 1), Data: d})
	}
	r := &store.Run{ID: id, OrganizationID: intern.OrganizationID, WorkspaceID: intern.WorkspaceID, InternID: intern.ID,
		SessionID: "bench", Status: store.RunCompleted, LastSeq: int64(n), EventBytes: size, CreatedAt: now, UpdatedAt: now, EndedAt: &now}
	if _, err := db.NewInsert().Model(r).Exec(ctx); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < n; i += 500 {
		part := evs[i:min(i+500, n)]
		if _, err := db.NewInsert().Model(&part).Exec(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	return id, size
}

// BenchmarkRunsReaders measures 100 readers resuming one run's event
// stream at once, each after a random sequence number of a 1,000-chunk
// run, reading to its end: events/s delivered over all readers.
func BenchmarkRunsReaders(b *testing.B) {
	benchDBs(b, func(b *testing.B, open func(testing.TB) *bun.DB) {
		f := newFixture(b, open(b), nil)
		var in store.Intern
		if err := f.e.DB.NewSelect().Model(&in).Where("id = ?", f.e.InternID).Scan(context.Background()); err != nil {
			b.Fatal(err)
		}
		id, _ := storedRun(b, f.e.DB, &in, 1000)
		const readers = 100
		var total int64
		b.ResetTimer()
		t0 := time.Now()
		for range b.N {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range readers {
				wg.Add(1)
				after := rand.Int64N(1000)
				go func() {
					defer wg.Done()
					got := events(b, f.e.HTTP.URL, f.e.WorkspaceKey, f.e.InternID, id, fmt.Sprintf("?after=%d", after), "")
					if int64(len(got)) != 1000-after {
						b.Errorf("after %d: %d events", after, len(got))
					}
					mu.Lock()
					total += int64(len(got))
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		b.ReportMetric(float64(total)/time.Since(t0).Seconds(), "events/s")
	})
}

// BenchmarkRunsStorage measures the database space 1,000 stored chunks
// take (rows and indexes; SQLite pages, PostgreSQL relation sizes), and
// their JSON.
func BenchmarkRunsStorage(b *testing.B) {
	benchDBs(b, func(b *testing.B, open func(testing.TB) *bun.DB) {
		f := newFixture(b, open(b), nil)
		db := f.e.DB
		ctx := context.Background()
		var in store.Intern
		if err := db.NewSelect().Model(&in).Where("id = ?", f.e.InternID).Scan(ctx); err != nil {
			b.Fatal(err)
		}
		size := func() int64 {
			var n int64
			var err error
			if db.Dialect().Name() == dialect.PG {
				err = db.NewRaw("SELECT pg_total_relation_size('run_events') + pg_total_relation_size('runs')").Scan(ctx, &n)
			} else {
				var pages, free, pageSize int64
				if err = db.NewRaw("PRAGMA page_count").Scan(ctx, &pages); err == nil {
					if err = db.NewRaw("PRAGMA freelist_count").Scan(ctx, &free); err == nil {
						err = db.NewRaw("PRAGMA page_size").Scan(ctx, &pageSize)
					}
				}
				n = (pages - free) * pageSize
			}
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
		// Warm: the tables' first pages exist before the measure.
		storedRun(b, db, &in, 1000)
		if db.Dialect().Name() == dialect.PG {
			db.ExecContext(ctx, "VACUUM run_events") //nolint:errcheck
		}
		var grew, json int64
		b.ResetTimer()
		for range b.N {
			before := size()
			_, j := storedRun(b, db, &in, 1000)
			grew += size() - before
			json += j
		}
		b.ReportMetric(float64(grew)/float64(b.N), "db-bytes/1000-chunks")
		b.ReportMetric(float64(json)/float64(b.N), "json-bytes/1000-chunks")
	})
}

// BenchmarkRunsLook measures one look of a gateway's runs loop (it runs
// every 500 ms on every replica, ADR 0921): the runs to take over (lease
// passed; on PostgreSQL also a dead holder's, ADR 0923) and the questions
// expired, over 1,000 running runs held by a live gateway and 100 paused
// ones: ns/op is the database time a replica spends per look.
func BenchmarkRunsLook(b *testing.B) {
	benchDBs(b, func(b *testing.B, open func(testing.TB) *bun.DB) {
		db := open(b)
		f := newFixture(b, db, nil)
		holder, looker := f.e.Server.Runs, runs.New(db, f.e.Server.Chat.Service, f.e.Server.Interns, nil, runs.Config{})
		b.Cleanup(looker.Close)
		ctx := context.Background()
		holder.Look(ctx) // takes its liveness lock
		var in store.Intern
		if err := db.NewSelect().Model(&in).Where("id = ?", f.e.InternID).Scan(ctx); err != nil {
			b.Fatal(err)
		}
		now := time.Now().UTC()
		until, deadline := now.Add(time.Hour), now.Add(time.Hour)
		var rows []store.Run
		for i := range 1100 {
			r := store.Run{ID: fmt.Sprintf("run_look_%d", i), OrganizationID: in.OrganizationID, WorkspaceID: in.WorkspaceID, InternID: in.ID,
				SessionID: "bench", Status: store.RunRunning, LeaseOwner: holder.Owner(), LeaseUntil: &until, CreatedAt: now, UpdatedAt: now}
			if i >= 1000 {
				r.Status, r.LeaseOwner, r.LeaseUntil, r.PauseDeadline = store.RunPaused, "", nil, &deadline
			}
			rows = append(rows, r)
		}
		if _, err := db.NewInsert().Model(&rows).Exec(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			looker.Look(ctx)
		}
		b.StopTimer()
		taken, err := db.NewSelect().Model((*store.Run)(nil)).Where("lease_owner = ?", looker.Owner()).Count(ctx)
		if err != nil || taken != 0 {
			b.Fatalf("a look took %d runs of a live gateway (%v)", taken, err)
		}
	})
}
