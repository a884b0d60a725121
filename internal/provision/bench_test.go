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
	"github.com/cohort-dev/cohort/internal/procstat"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// BenchmarkInternStart: from CreateIntern to a daemon that answers Status
// with its agent started, and then the memory (PSS) of the idle intern's
// whole process tree (the jail's init, the daemon, the agent), jailed and
// unjailed side by side. Every started intern stays up, as in a fleet.
//
//	go test ./internal/provision -run '^$' -bench InternStart -benchtime 40x -count 3
func BenchmarkInternStart(b *testing.B) {
	for _, jailed := range []bool{false, true} {
		b.Run(fmt.Sprintf("jailed=%v", jailed), func(b *testing.B) {
			e, prov := localEnv(b, storetest.SQLite(b), jailed, nil)
			ctx := context.Background()
			if err := prov.Start(ctx); err != nil {
				b.Fatal(err)
			}
			var starts []time.Duration
			var pss []float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				created, err := e.Server.Interns.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: fmt.Sprintf("bench-%d", i)})
				if err != nil {
					b.Fatal(err)
				}
				root := waitStarted(b, prov, created.GetId(), jailed)
				starts = append(starts, time.Since(t0))
				pss = append(pss, procstat.TreePSS(root)/(1<<20))
			}
			b.StopTimer()
			slices.Sort(starts)
			slices.Sort(pss)
			b.ReportMetric(float64(starts[len(starts)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(starts[(len(starts)*99)/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(pss[len(pss)/2], "idle-PSS-MiB")
		})
	}
}

// waitStarted polls until the intern's daemon answers Status and its agent
// runs; it returns the pid at the root of the intern's processes.
func waitStarted(b *testing.B, prov *provision.Provisioner, id string, jailed bool) int {
	deadline := time.Now().Add(60 * time.Second)
	ctx := context.Background()
	for time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
		pid := local(prov).DaemonPID(id)
		if pid == 0 {
			continue
		}
		var in store.Intern
		if err := prov.DB.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil || in.State != store.InternRunning {
			continue
		}
		c, err := prov.Client(ctx, &in)
		if err != nil {
			continue
		}
		if _, err := c.Status(ctx, connect.NewRequest(&pb.StatusRequest{})); err != nil {
			continue
		}
		want := 2 // daemon, agent
		if jailed {
			want = 3 // and the jail's init
		}
		if len(procstat.Tree(pid)) >= want {
			return pid
		}
	}
	b.Fatalf("intern %s did not start", id)
	return 0
}
