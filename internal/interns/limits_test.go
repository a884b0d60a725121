package interns_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// An intern's own limits go through the API to its row and back, on both
// databases: set at creation with a management key, changed field by field,
// returned to the operator's with 0, and refused with a workspace key.
func TestInternLimitsRoundTrip(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		res, err := c.CreateIntern(ctx, authed(e.ManagementKey, &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: "small",
			Limits: &cohortv1.InternLimits{MemoryBytes: proto.Int64(256 << 20), MaxProcesses: proto.Int32(64), Cpus: proto.Float64(0.5),
				TmpfsBytes: proto.Int64(16 << 20), DiskBytes: proto.Int64(1 << 20)}}))
		if err != nil {
			t.Fatal(err)
		}
		in := res.Msg.GetIntern()
		want := &cohortv1.InternLimits{MemoryBytes: proto.Int64(256 << 20), MaxProcesses: proto.Int32(64), Cpus: proto.Float64(0.5),
			TmpfsBytes: proto.Int64(16 << 20), DiskBytes: proto.Int64(1 << 20)}
		if !proto.Equal(in.GetLimits(), want) {
			t.Fatalf("created with %v, want %v", in.GetLimits(), want)
		}
		row := func() config.InternLimits {
			t.Helper()
			var r store.Intern
			if err := e.DB.NewSelect().Model(&r).Where("id = ?", in.GetId()).Scan(ctx); err != nil {
				t.Fatal(err)
			}
			return r.Limits
		}
		if got := row(); got != (config.InternLimits{Memory: 256 << 20, Processes: 64, CPUs: 0.5, Tmpfs: 16 << 20, Disk: 1 << 20}) {
			t.Fatalf("row %+v", got)
		}

		// An update changes the fields it names and keeps the others; 0
		// returns one to the operator's.
		u, err := c.UpdateIntern(ctx, authed(e.ManagementKey, &cohortv1.UpdateInternRequest{Id: in.GetId(),
			Limits: &cohortv1.InternLimits{MemoryBytes: proto.Int64(512 << 20), Cpus: proto.Float64(0), CpuWeight: proto.Int32(50)}}))
		if err != nil {
			t.Fatal(err)
		}
		want = &cohortv1.InternLimits{MemoryBytes: proto.Int64(512 << 20), MaxProcesses: proto.Int32(64), CpuWeight: proto.Int32(50),
			TmpfsBytes: proto.Int64(16 << 20), DiskBytes: proto.Int64(1 << 20)}
		if !proto.Equal(u.Msg.GetIntern().GetLimits(), want) {
			t.Fatalf("updated to %v, want %v", u.Msg.GetIntern().GetLimits(), want)
		}
		g, err := c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: in.GetId()}))
		if err != nil || !proto.Equal(g.Msg.GetIntern().GetLimits(), want) {
			t.Fatalf("get: %v %v", g, err)
		}
		if got := row(); got != (config.InternLimits{Memory: 512 << 20, Processes: 64, CPUWeight: 50, Tmpfs: 16 << 20, Disk: 1 << 20}) {
			t.Fatalf("row %+v", got)
		}
		// An update of something else leaves the limits alone.
		name := "renamed"
		if u, err := c.UpdateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.UpdateInternRequest{Id: in.GetId(), Name: &name})); err != nil ||
			!proto.Equal(u.Msg.GetIntern().GetLimits(), want) {
			t.Fatalf("rename: %v %v", u, err)
		}

		// A workspace key may not set them: it could raise what the
		// management key lowered.
		_, err = c.UpdateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.UpdateInternRequest{Id: in.GetId(),
			Limits: &cohortv1.InternLimits{MemoryBytes: proto.Int64(1 << 30)}}))
		if ae := apierr.FromConnect(err); ae.Status != http.StatusForbidden || !strings.Contains(ae.Message, "management key") {
			t.Fatalf("workspace key: %+v", ae)
		}
		_, err = c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "x",
			Limits: &cohortv1.InternLimits{MaxProcesses: proto.Int32(100)}}))
		if ae := apierr.FromConnect(err); ae.Status != http.StatusForbidden {
			t.Fatalf("workspace key create: %+v", ae)
		}
		if got := row(); got.Memory != 512<<20 {
			t.Fatalf("refused update changed the row: %+v", got)
		}

		// All back to the operator's: the intern shows none of its own.
		zero := &cohortv1.InternLimits{MemoryBytes: proto.Int64(0), MaxProcesses: proto.Int32(0), CpuWeight: proto.Int32(0),
			Cpus: proto.Float64(0), TmpfsBytes: proto.Int64(0), DiskBytes: proto.Int64(0)}
		u, err = c.UpdateIntern(ctx, authed(e.ManagementKey, &cohortv1.UpdateInternRequest{Id: in.GetId(), Limits: zero}))
		if err != nil || u.Msg.GetIntern().GetLimits() != nil || row() != (config.InternLimits{}) {
			t.Fatalf("cleared: %v %v %+v", u, err, row())
		}
	})
}

// Each limit is accepted at its bound and refused one step past it, with a
// 400 naming the field; the operator's setting is the ceiling (here
// serve's defaults: 4 GiB, 1,024 processes, weight 100, 1 GiB tmpfs, 10
// GiB disk, and a ceiling of 2 CPUs set by the test).
func TestInternLimitsBounds(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		if got := e.Server.Interns.Ceiling; got.Memory != 4<<30 || got.Processes != 1024 || got.Tmpfs != 1<<30 || got.Disk != 10<<30 {
			t.Fatalf("the server's ceiling is not serve's settings: %+v", got)
		}
		e.Server.Interns.Ceiling.CPUs = 2
		res, err := c.CreateIntern(ctx, authed(e.ManagementKey, &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: "b"}))
		if err != nil {
			t.Fatal(err)
		}
		id := res.Msg.GetIntern().GetId()
		for _, tc := range []struct {
			field    string
			ok, past *cohortv1.InternLimits
			says     string
		}{
			{"limits.memory_bytes", &cohortv1.InternLimits{MemoryBytes: proto.Int64(4 << 30)}, &cohortv1.InternLimits{MemoryBytes: proto.Int64(4<<30 + 1)}, "--intern-memory 4GiB"},
			{"limits.memory_bytes", &cohortv1.InternLimits{MemoryBytes: proto.Int64(64 << 20)}, &cohortv1.InternLimits{MemoryBytes: proto.Int64(64<<20 - 1)}, "from 64MiB"},
			{"limits.memory_bytes", nil, &cohortv1.InternLimits{MemoryBytes: proto.Int64(-1)}, "from 64MiB"},
			{"limits.max_processes", &cohortv1.InternLimits{MaxProcesses: proto.Int32(1024)}, &cohortv1.InternLimits{MaxProcesses: proto.Int32(1025)}, "--intern-max-processes 1024"},
			{"limits.max_processes", &cohortv1.InternLimits{MaxProcesses: proto.Int32(32)}, &cohortv1.InternLimits{MaxProcesses: proto.Int32(31)}, "from 32"},
			{"limits.cpu_weight", &cohortv1.InternLimits{CpuWeight: proto.Int32(100)}, &cohortv1.InternLimits{CpuWeight: proto.Int32(101)}, "--intern-cpu-weight 100"},
			{"limits.cpu_weight", &cohortv1.InternLimits{CpuWeight: proto.Int32(1)}, &cohortv1.InternLimits{CpuWeight: proto.Int32(-5)}, "from 1"},
			{"limits.cpus", &cohortv1.InternLimits{Cpus: proto.Float64(2)}, &cohortv1.InternLimits{Cpus: proto.Float64(2.01)}, "--intern-cpus 2"},
			{"limits.cpus", &cohortv1.InternLimits{Cpus: proto.Float64(0.01)}, &cohortv1.InternLimits{Cpus: proto.Float64(0.009)}, "from 0.01"},
			{"limits.tmpfs_bytes", &cohortv1.InternLimits{TmpfsBytes: proto.Int64(1 << 30)}, &cohortv1.InternLimits{TmpfsBytes: proto.Int64(1<<30 + 1)}, "--intern-tmpfs 1GiB"},
			{"limits.tmpfs_bytes", &cohortv1.InternLimits{TmpfsBytes: proto.Int64(1 << 20)}, &cohortv1.InternLimits{TmpfsBytes: proto.Int64(1<<20 - 1)}, "from 1MiB"},
			{"limits.disk_bytes", &cohortv1.InternLimits{DiskBytes: proto.Int64(10 << 30)}, &cohortv1.InternLimits{DiskBytes: proto.Int64(10<<30 + 1)}, "--intern-disk 10GiB"},
			{"limits.disk_bytes", &cohortv1.InternLimits{DiskBytes: proto.Int64(1 << 20)}, &cohortv1.InternLimits{DiskBytes: proto.Int64(1<<20 - 1)}, "from 1MiB"},
		} {
			if tc.ok != nil {
				u, err := c.UpdateIntern(ctx, authed(e.ManagementKey, &cohortv1.UpdateInternRequest{Id: id, Limits: tc.ok}))
				if err != nil {
					t.Errorf("%s at its bound %v: %v", tc.field, tc.ok, err)
				} else if !proto.Equal(pick(u.Msg.GetIntern().GetLimits(), tc.ok), tc.ok) {
					t.Errorf("%s at its bound %v: stored %v", tc.field, tc.ok, u.Msg.GetIntern().GetLimits())
				}
			}
			before, _ := c.GetIntern(ctx, authed(e.ManagementKey, &cohortv1.GetInternRequest{Id: id}))
			_, err := c.UpdateIntern(ctx, authed(e.ManagementKey, &cohortv1.UpdateInternRequest{Id: id, Limits: tc.past}))
			if err == nil {
				t.Errorf("%s past its bound %v: accepted", tc.field, tc.past)
			} else if ae := apierr.FromConnect(err); ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, tc.field) || !strings.Contains(ae.Message, tc.says) {
				t.Errorf("%s past its bound %v: %d %q", tc.field, tc.past, ae.Status, ae.Message)
			}
			after, _ := c.GetIntern(ctx, authed(e.ManagementKey, &cohortv1.GetInternRequest{Id: id}))
			if !proto.Equal(before.Msg.GetIntern().GetLimits(), after.Msg.GetIntern().GetLimits()) {
				t.Errorf("%s: a refused update changed the limits", tc.field)
			}
			// The same refusal at creation.
			_, err = c.CreateIntern(ctx, authed(e.ManagementKey, &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: "p", Limits: tc.past}))
			if err == nil {
				t.Errorf("create with %s past its bound: accepted", tc.field)
			} else if ae := apierr.FromConnect(err); ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, tc.field) {
				t.Errorf("create with %s past its bound: %+v", tc.field, ae)
			}
		}
	})
}

// pick is got's fields that want sets.
func pick(got, want *cohortv1.InternLimits) *cohortv1.InternLimits {
	out := &cohortv1.InternLimits{}
	if want.MemoryBytes != nil {
		out.MemoryBytes = proto.Int64(got.GetMemoryBytes())
	}
	if want.MaxProcesses != nil {
		out.MaxProcesses = proto.Int32(got.GetMaxProcesses())
	}
	if want.CpuWeight != nil {
		out.CpuWeight = proto.Int32(got.GetCpuWeight())
	}
	if want.Cpus != nil {
		out.Cpus = proto.Float64(got.GetCpus())
	}
	if want.TmpfsBytes != nil {
		out.TmpfsBytes = proto.Int64(got.GetTmpfsBytes())
	}
	if want.DiskBytes != nil {
		out.DiskBytes = proto.Int64(got.GetDiskBytes())
	}
	return out
}
