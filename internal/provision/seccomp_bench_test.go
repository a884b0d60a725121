package provision_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/storetest"
)

// BenchmarkSeccompWake: a jailed intern from CreateIntern (the local
// provisioner starts its jail, daemon and agent, as a wake does) to the
// first text chunk of a cohort/demo turn, with the daemon's jail filtered
// (the default) and not, side by side.
//
//	go test ./internal/provision -run '^$' -bench SeccompWake -benchtime 30x -count 3
func BenchmarkSeccompWake(b *testing.B) {
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("seccomp=%v", !off), func(b *testing.B) {
			e, prov := localEnv(b, storetest.SQLite(b), true, nil)
			prov.Jail.NoSeccomp = off
			ctx := context.Background()
			if err := prov.Start(ctx); err != nil {
				b.Fatal(err)
			}
			var firsts []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				created, err := e.Server.Interns.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: fmt.Sprintf("wake-%d", i)})
				if err != nil {
					b.Fatal(err)
				}
				firsts = append(firsts, firstChunk(b, prov, created.GetId()).Sub(t0))
			}
			b.StopTimer()
			slices.Sort(firsts)
			b.ReportMetric(float64(firsts[len(firsts)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(firsts[(len(firsts)*99)/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// firstChunk starts a turn as soon as the daemon takes one and returns
// when its first text chunk arrived.
func firstChunk(b *testing.B, prov *provision.Provisioner, id string) time.Time {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		var in store.Intern
		if err := prov.DB.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil || in.State != store.InternRunning {
			continue
		}
		c, err := prov.Client(ctx, &in)
		if err != nil {
			continue
		}
		st, err := c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{Prompt: "hello"}))
		if err != nil {
			continue
		}
		for st.Receive() {
			if st.Msg().GetEvent().GetText() != nil {
				at := time.Now()
				st.Close()
				return at
			}
		}
		st.Close()
	}
	b.Fatalf("intern %s gave no chunk", id)
	return time.Time{}
}
