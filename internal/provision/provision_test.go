package provision_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func loadIntern(t *testing.T, db *bun.DB, id string) *store.Intern {
	t.Helper()
	var in store.Intern
	if err := db.NewSelect().Model(&in).Where("id = ?", id).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &in
}

// local is the local jails' backend of a fleet the tests built.
func local(p *provision.Provisioner) *localjail.Backend { return p.Backend.(*localjail.Backend) }

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

func status(t *testing.T, p *provision.Provisioner, in *store.Intern) (*pb.StatusResponse, error) {
	t.Helper()
	c, err := p.Client(context.Background(), in)
	if err != nil {
		return nil, err
	}
	res, err := c.Status(context.Background(), connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// The local backend starts a real `cohort intern` process per running
// intern (jailed, or as a plain child with --unsafe-shared-host), told
// where the gateway is, refusing calls without its secret, one per intern.
// Its lifecycle (crash, model change, suspend, delete, adoption) is
// TestBackendConformance's.
func TestLocalLifecycle(t *testing.T) {
	t.Parallel()
	for _, jailed := range []bool{true, false} {
		t.Run(fmt.Sprintf("jailed=%v", jailed), func(t *testing.T) { testLocalLifecycle(t, jailed) })
	}
}

func testLocalLifecycle(t *testing.T, jailed bool) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e, prov := localEnv(t, db, jailed, func(p *provision.Provisioner) { local(p).GatewayURL = "http://gateway.test:1/api/v1" })
		dataDir := local(prov).DataDir
		ctx := context.Background()
		id := e.InternID

		// Gateway start: the bootstrap intern (provisioning) gets a daemon.
		if err := prov.Start(ctx); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "running", func() bool { return loadIntern(t, db, id).State == store.InternRunning })
		// The daemon is told where the gateway's vault is (in a jail: the
		// gateway relay), and a jailed one runs under the jail's init.
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", local(prov).DaemonPID(id)))
		if err != nil {
			t.Fatal(err)
		}
		if jailed {
			if !strings.HasPrefix(string(cmdline), "cohort-jail-init") {
				t.Fatalf("the daemon's process is not a jail: %q", cmdline)
			}
		} else if !strings.Contains(string(cmdline), "--gateway-url\x00http://gateway.test:1/api/v1") {
			t.Fatalf("daemon command line lacks --gateway-url: %q", cmdline)
		}
		in := loadIntern(t, db, id)
		if in.Provisioner != localjail.Name || !strings.HasPrefix(in.DaemonURL, "http://127.0.0.1:") || in.DaemonSecret == "" {
			t.Fatalf("daemon record: %+v", in)
		}
		st, err := status(t, prov, in)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetInternId() != id || st.GetModel() != "cohort/demo" {
			t.Fatalf("status: %v", st)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "interns", id, "sessions")); err != nil {
			t.Fatalf("data directory: %v", err)
		}
		// The daemon refuses calls without its secret.
		res, err := testutil.H2CClient("").Post(in.DaemonURL+"/cohort.internd.v1.InternDaemonService/Status", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("unauthenticated Status: %d", res.StatusCode)
		}

		// A new intern gets its own daemon, directory and secret.
		created, err := e.Server.Interns.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: "second"})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "second running", func() bool { return loadIntern(t, db, created.GetId()).State == store.InternRunning })
		if a, b := loadIntern(t, db, id), loadIntern(t, db, created.GetId()); a.DaemonURL == b.DaemonURL || a.DaemonSecret == b.DaemonSecret {
			t.Fatal("two interns share a daemon or a secret")
		}

	})
}

// startDaemon serves an in-process daemon (its agent never starts: Status
// still answers) as an operator would run one remotely.
func startDaemon(t *testing.T, secret string) string {
	t.Helper()
	d, err := internd.New(internd.Config{InternID: "remote", Secret: secret, DataDir: t.TempDir(), AgentCommand: []string{"/nonexistent/agent"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() }) // after the server has closed
	return testutil.ServeH2C(t, d.Handler()).URL
}

func TestRemoteRegister(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		var prov *provision.Provisioner
		e := testenv.New(t, db, func(s *server.Server) {
			prov = &provision.Provisioner{DB: db, KEK: s.KEK, Log: s.Log, Backend: &remote.Backend{}, HealthTimeout: 2 * time.Second}
			s.Provisioner, s.Interns.Lifecycle = prov, prov
		})
		ctx := context.Background()
		const secret = "remote-daemon-secret-0123456789"
		url := startDaemon(t, secret)
		before := loadIntern(t, db, e.InternID)

		for _, c := range []struct {
			id, url, secret string
			status          int
			reason          apierr.Reason
		}{
			{e.InternID, url, "wrong-secret", 502, "intern_unreachable"},
			{e.InternID, "ftp://example", secret, 400, "bad_request"},
			{e.InternID, "not a url", secret, 400, "bad_request"},
			{e.InternID, url, "  ", 400, "bad_request"},
			{"no-such-intern", url, secret, 404, "not_found"},
		} {
			_, err := remote.Register(ctx, prov, c.id, c.url, c.secret)
			if !apierr.Is(err, c.status, c.reason) {
				t.Fatalf("Register(%q, %q): want %d %s, got %v", c.url, c.secret, c.status, c.reason, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatal("error shows the secret")
			}
		}
		if after := loadIntern(t, db, e.InternID); *after != *before {
			t.Fatalf("refused registrations changed the intern: %+v", after)
		}

		in, err := remote.Register(ctx, prov, e.InternID, url+"/", secret)
		if err != nil {
			t.Fatal(err)
		}
		if in.State != store.InternRunning || in.DaemonURL != url || in.Provisioner != remote.Name {
			t.Fatalf("registered: %+v", in)
		}
		// Stored wrapped, never in clear.
		raw, _ := base64.StdEncoding.DecodeString(in.DaemonSecret)
		if strings.Contains(in.DaemonSecret, secret) || strings.Contains(string(raw), secret) {
			t.Fatal("daemon secret stored in clear")
		}
		if strings.Contains(e.Logs(), secret) {
			t.Fatal("daemon secret in the logs")
		}
		st, err := status(t, prov, in)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetInternId() != "remote" {
			t.Fatalf("status: %v", st)
		}
		// A wrapped secret copied onto another intern does not open.
		other := *in
		other.ID = "another"
		if _, err := db.NewInsert().Model(&store.Intern{ID: "another", OrganizationID: in.OrganizationID, WorkspaceID: in.WorkspaceID,
			Name: "x", Model: "m", State: store.InternRunning, CreatedAt: in.CreatedAt, DaemonURL: in.DaemonURL, DaemonSecret: in.DaemonSecret}).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := prov.Client(ctx, &other); !apierr.Is(err, 502, "intern_unreachable") {
			t.Fatalf("copied secret: %v", err)
		}
		// ClientFor (a row read in the request) applies the same checks, and
		// its cache of dialed clients is keyed by the intern too: the copy
		// does not open even though the original was just dialed.
		if _, err := prov.ClientFor(loadIntern(t, db, e.InternID)); err != nil {
			t.Fatalf("ClientFor: %v", err)
		}
		if _, err := prov.ClientFor(loadIntern(t, db, "another")); !apierr.Is(err, 502, "intern_unreachable") {
			t.Fatalf("ClientFor copied secret: %v", err)
		}
		stopped := *loadIntern(t, db, e.InternID)
		stopped.State = store.InternSuspended
		if _, err := prov.ClientFor(&stopped); !apierr.Is(err, 409, "intern_not_ready") {
			t.Fatalf("ClientFor suspended row: %v", err)
		}
		// Suspended: not ready; resumed: running again once the daemon
		// answers (the reconciler sees to it).
		if err := prov.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(prov.Close)
		if _, err := e.Server.Interns.Suspend(ctx, e.Operator(), e.InternID); err != nil {
			t.Fatal(err)
		}
		if _, err := prov.Client(ctx, in); !apierr.Is(err, 409, "intern_not_ready") {
			t.Fatalf("suspended: %v", err)
		}
		if _, err := e.Server.Interns.Resume(ctx, e.Operator(), e.InternID); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "resumed remote running", func() bool { return loadIntern(t, db, e.InternID).State == store.InternRunning })
	})
}
