package vault_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

// Value sizes: a typical API token, and the largest value the spec allows.
var benchValues = []struct {
	name  string
	value string
}{
	{"token", "sk-" + strings.Repeat("x", 45)},
	{"max", strings.Repeat("v", vault.MaxValue)},
}

// BenchmarkPut measures PUT /vault/interns/{id}/secrets/{name} through the
// real gateway handler (auth, gates, validation, intern lookup, crypto,
// upsert) over HTTP on each store. "serial" is one client; "parallel" is
// GOMAXPROCS×4 clients. 1024 names are cycled, so after the first pass
// every write replaces a row.
func BenchmarkPut(b *testing.B) {
	for _, st := range []struct {
		name string
		open func(testing.TB) *bun.DB
	}{{"sqlite", storetest.SQLite}, {"sqlite-normal-sync", func(t testing.TB) *bun.DB { return storetest.SQLiteSync(t, "NORMAL") }},
		{"postgres", storetest.Postgres}} {
		b.Run(st.name, func(b *testing.B) {
			e := testenv.New(b, st.open(b))
			client := e.HTTPClient()
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
			for _, v := range benchValues {
				body := putBody(b, []string{"api.example.com"}, v.value)
				send := func(i int64) error {
					req, err := http.NewRequest("PUT", e.URL+secretPath(e.InternID, fmt.Sprintf("%s_%d", v.name, i%1024)), strings.NewReader(body))
					if err != nil {
						return err
					}
					req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
					req.Header.Set("Content-Type", "application/json")
					res, err := client.Do(req)
					if err != nil {
						return err
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 && res.StatusCode != 201 {
						return fmt.Errorf("status %d", res.StatusCode)
					}
					return nil
				}
				b.Run(strings.ToLower(v.name)+"/serial", func(b *testing.B) {
					b.SetBytes(int64(len(body)))
					for i := range b.N {
						if err := send(int64(i)); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				})
				b.Run(strings.ToLower(v.name)+"/parallel", func(b *testing.B) {
					b.SetBytes(int64(len(body)))
					b.SetParallelism(4)
					var n, failed atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if send(n.Add(1)) != nil {
								failed.Add(1)
							}
						}
					})
					if failed.Load() > 0 {
						b.Fatalf("%d requests failed", failed.Load())
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				})
			}
		})
	}
}

// BenchmarkCrypto measures the cryptography of one write alone: sealing
// the value (AES-256-GCM, bound to vault, name and hosts) and its
// fingerprint (HMAC-SHA-256), with the vault's keys already unwrapped (the
// gateway caches them); and the rarer steps: unwrapping a vault's keys (a
// cache miss) and making a new vault's keys.
func BenchmarkCrypto(b *testing.B) {
	kek, err := envelope.LoadOrCreate(filepath.Join(b.TempDir(), "kek.json"))
	if err != nil {
		b.Fatal(err)
	}
	v := &store.Vault{ID: uuid.NewString(), ScopeKind: store.VaultScopeIntern, OwnerID: uuid.NewString()}
	kr, err := vault.NewKeyring(kek, v)
	if err != nil {
		b.Fatal(err)
	}
	hosts := []string{"api.example.com"}
	for _, val := range benchValues {
		b.Run("write/"+strings.ToLower(val.name), func(b *testing.B) {
			b.SetBytes(int64(len(val.value)))
			for range b.N {
				value := []byte(val.value) // as Put converts the request's string
				if _, err := kr.Seal(v.ID, "api_key", hosts, value); err != nil {
					b.Fatal(err)
				}
				if _, err := kr.Fingerprint(value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("open-keys", func(b *testing.B) {
		for range b.N {
			if _, err := vault.OpenKeyring(kek, v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new-keys", func(b *testing.B) {
		for range b.N {
			nv := &store.Vault{ID: v.ID, ScopeKind: v.ScopeKind, OwnerID: v.OwnerID}
			if _, err := vault.NewKeyring(kek, nv); err != nil {
				b.Fatal(err)
			}
		}
	})
}
