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
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// BenchmarkSeccompWake: a jailed intern from CreateIntern (the local
// provisioner starts its jail, daemon and agent, as a wake does) to the
// first text chunk of a cohort/demo turn, with the daemon's jail filtered
// (the default) and not. Two gateways' provisioners take turns, so a busy
// machine weighs on both alike.
//
//	go test ./internal/provision -run '^$' -bench SeccompWake -benchtime 20x -count 3
func BenchmarkSeccompWake(b *testing.B) {
	type side struct {
		name string
		e    *testenv.Env
		prov *provision.Provisioner
		took []time.Duration
	}
	ctx := context.Background()
	var sides []*side
	for _, off := range []bool{true, false} {
		e, prov := localEnv(b, storetest.SQLite(b), true, nil)
		local(prov).Jail.NoSeccomp = off
		if err := prov.Start(ctx); err != nil {
			b.Fatal(err)
		}
		sides = append(sides, &side{name: map[bool]string{true: "off", false: "on"}[off], e: e, prov: prov})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, s := range sides {
			t0 := time.Now()
			created, err := s.e.Server.Interns.Create(ctx, s.e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: s.e.WorkspaceID, Name: fmt.Sprintf("wake-%d", i)})
			if err != nil {
				b.Fatal(err)
			}
			s.took = append(s.took, firstChunk(b, s.prov, created.GetId()).Sub(t0))
		}
	}
	b.StopTimer()
	for _, s := range sides {
		slices.Sort(s.took)
		b.ReportMetric(float64(s.took[len(s.took)/2].Microseconds())/1000, "seccomp-"+s.name+"-p50-ms")
		b.ReportMetric(float64(s.took[(len(s.took)*99)/100].Microseconds())/1000, "seccomp-"+s.name+"-p99-ms")
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
