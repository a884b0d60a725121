package secretflow_test

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// BenchmarkSecretRelease measures one http_request to a loopback TLS stand-in
// for the bound host, side by side: "plain" without a placeholder; "release"
// with one {{secret:…}} in a header, released through the gateway's
// InternGatewayService over HTTP (daemon-secret check, intern and vault
// lookup, decrypt, audit insert) and substituted, the response redacted.
// The difference is the added latency of a release. p50-µs is the median
// of the measured operations.
func BenchmarkSecretRelease(b *testing.B) {
	for _, st := range []struct {
		name string
		open func(testing.TB) *bun.DB
	}{{"sqlite", storetest.SQLite}, {"postgres", storetest.Postgres}} {
		b.Run(st.name, func(b *testing.B) {
			e := testenv.New(b, st.open(b))
			ctx := context.Background()
			host := newBenchHost(b)
			tool := httptool.New(httptool.Options{ExtraRoots: []*x509.Certificate{host.srv.Certificate()}, AllowLoopback: true,
				Resolve: func(string) string { return "127.0.0.1" }})
			v, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "sk-0123456789abcdef0123456789abcdef0123456789ab"})
			if st, body, _ := e.Do(b, "PUT", "/vault/interns/"+e.InternID+"/secrets/api_key", e.WorkspaceKey, "application/json", string(v)); st != 201 {
				b.Fatal(st, body)
			}
			const secret = "bench-daemon-secret"
			ct, _ := e.Server.KEK.Wrap([]byte(secret), []byte("cohort/intern-daemon-secret/"+e.InternID))
			e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("daemon_secret = ?", base64.StdEncoding.EncodeToString(ct)).Where("id = ?", e.InternID).Exec(ctx)
			gw := cohortv1connect.NewInternGatewayServiceClient(e.HTTPClient(), e.URL)
			release := func(ctx context.Context, name, h string) (string, error) {
				r := connect.NewRequest(&cohortv1.ReleaseSecretRequest{InternId: e.InternID, Name: name, Host: h, RunId: "bench"})
				r.Header().Set("Authorization", "Bearer "+launch.DaemonCredential(secret))
				res, err := gw.ReleaseSecret(ctx, r)
				if err != nil {
					return "", err
				}
				return res.Msg.GetValue(), nil
			}
			url := "https://api.example.com:" + host.port() + "/v1/things"
			for _, c := range []struct {
				name string
				auth string
			}{{"plain", "Bearer sk-0123456789abcdef0123456789abcdef0123456789ab"}, {"release", "Bearer {{secret:api_key}}"}} {
				b.Run(c.name, func(b *testing.B) {
					args := &httptool.Args{URL: url, Headers: map[string]string{"Authorization": c.auth}}
					durs := make([]time.Duration, 0, b.N)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						t0 := time.Now()
						res, err := tool.Do(ctx, args, release)
						if err != nil || res.Status != 200 {
							b.Fatal(res, err)
						}
						durs = append(durs, time.Since(t0))
					}
					b.StopTimer()
					slices.Sort(durs)
					b.ReportMetric(float64(durs[len(durs)/2].Microseconds()), "p50-µs")
				})
			}
		})
	}
}

func newBenchHost(b *testing.B) *boundHost { return newBoundHostTB(b) }
