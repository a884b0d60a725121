package workspaces_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

var benchSeq atomic.Int64

// BenchmarkCreate compares, on each store, the bare store write of a
// workspace row with the whole request path (auth lookup, decode,
// validation, insert, encode) served in-process and over loopback HTTP.
//
//	go test ./internal/workspaces -run '^$' -bench BenchmarkCreate -count 6
func BenchmarkCreate(b *testing.B) {
	for _, engine := range []struct {
		name string
		open func(testing.TB) *bun.DB
	}{{"sqlite", storetest.SQLite}, {"postgres", storetest.Postgres}} {
		b.Run(engine.name+"/store", func(b *testing.B) {
			e := testenv.New(b, engine.open(b))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				n := benchSeq.Add(1)
				w := &store.Workspace{ID: uuid.NewString(), OrganizationID: e.OrganizationID, Name: "bench", Slug: fmt.Sprintf("s%d", n),
					DefaultProviderSort: "price", IOLoggingSamplingRate: 1, CreatedAt: store.Now(nil), CreatedBy: e.AdminUserID}
				if _, err := e.DB.NewInsert().Model(w).Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(engine.name+"/handler", func(b *testing.B) {
			e := testenv.New(b, engine.open(b))
			h := e.Server.Handler()
			b.ReportAllocs()
			for b.Loop() {
				n := benchSeq.Add(1)
				req := httptest.NewRequest("POST", "/api/v1/workspaces", strings.NewReader(fmt.Sprintf(`{"name":"bench","slug":"h%d"}`, n)))
				req.Header.Set("Authorization", "Bearer "+e.ManagementKey)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
		b.Run(engine.name+"/loopback-parallel", func(b *testing.B) {
			e := testenv.New(b, engine.open(b))
			client := e.HTTPClient()
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := benchSeq.Add(1)
					req, _ := http.NewRequest("POST", e.URL+"/workspaces", strings.NewReader(fmt.Sprintf(`{"name":"bench","slug":"p%d"}`, n)))
					req.Header.Set("Authorization", "Bearer "+e.ManagementKey)
					res, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					res.Body.Close()
					if res.StatusCode != http.StatusCreated {
						b.Fatalf("status %d", res.StatusCode)
					}
				}
			})
		})
	}
}
