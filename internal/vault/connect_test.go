package vault_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

func vaultClient(e *testenv.Env) cohortv1connect.VaultServiceClient {
	return cohortv1connect.NewVaultServiceClient(e.HTTPClient(), e.URL)
}

func connectPut(key string, req *cohortv1.PutInternSecretRequest) *connect.Request[cohortv1.PutInternSecretRequest] {
	r := connect.NewRequest(req)
	if key != "" {
		r.Header().Set("Authorization", "Bearer "+key)
	}
	return r
}

// wantConnectError checks the code, the detail's reason and HTTP status.
func wantConnectError(t testing.TB, err error, code connect.Code, status int, reason string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code {
		t.Fatalf("want %v, got %v", code, err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if det, ok := v.(*cohortv1.ErrorDetail); derr == nil && ok {
			if det.GetReason() != reason || int(det.GetHttpStatus()) != status {
				t.Fatalf("detail %v, want %d %q", det, status, reason)
			}
			return
		}
	}
	t.Fatalf("no ErrorDetail on %v", err)
}

func TestConnectDoor(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := vaultClient(e)
		req := &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "api_key", Hosts: []string{"X.com.", "x.com"}, Value: "connect-value"}
		res, err := c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, req))
		if err != nil {
			t.Fatal(err)
		}
		s := res.Msg.GetSecret()
		if !res.Msg.GetCreated() || s.GetName() != "api_key" || strings.Join(s.GetHosts(), ",") != "x.com" ||
			!fingerprintRE.MatchString(s.GetFingerprint()) || s.GetCreatedAt() == nil {
			t.Fatalf("created: %v", res.Msg)
		}
		again, err := c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, req))
		if err != nil || again.Msg.GetCreated() || again.Msg.GetSecret().GetFingerprint() != s.GetFingerprint() ||
			!again.Msg.GetSecret().GetCreatedAt().AsTime().Equal(s.GetCreatedAt().AsTime()) {
			t.Fatalf("replaced: %v %v", again, err)
		}
		// The REST door sees the same secret: one implementation.
		rest := mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"x.com"}, "connect-value", 200)
		if *rest.Fingerprint != s.GetFingerprint() {
			t.Fatal("doors disagree on the fingerprint")
		}

		before := counts(t, e)
		bad := []struct {
			what   string
			key    string
			req    *cohortv1.PutInternSecretRequest
			code   connect.Code
			status int
			reason string
		}{
			{"empty name", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Hosts: []string{"x.com"}, Value: "v"}, connect.CodeInvalidArgument, 400, "bad_request"},
			{"bad host", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: []string{"x.com:443"}, Value: "v"}, connect.CodeInvalidArgument, 400, "bad_request"},
			{"101 hosts", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: hostsN(101), Value: "v"}, connect.CodeInvalidArgument, 400, "bad_request"},
			{"long value", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: []string{"x.com"}, Value: strings.Repeat("é", 65537)}, connect.CodeInvalidArgument, 400, "bad_request"},
			{"no intern id", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{Name: "n", Hosts: []string{"x.com"}, Value: "v"}, connect.CodeInvalidArgument, 400, "bad_request"},
			{"missing intern", e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: "00000000-0000-4000-8000-000000000000", Name: "n", Hosts: []string{"x.com"}, Value: "v"}, connect.CodeNotFound, 404, "not_found"},
			{"management key", e.ManagementKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: []string{"x.com"}, Value: "v"}, connect.CodePermissionDenied, 403, "forbidden"},
			{"no key", "", &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: []string{"x.com"}, Value: "v"}, connect.CodeUnauthenticated, 401, ""},
		}
		for _, b := range bad {
			_, err := c.PutInternSecret(ctx, connectPut(b.key, b.req))
			t.Run(b.what, func(t *testing.T) { wantConnectError(t, err, b.code, b.status, b.reason) })
		}
		// Over the body bound: refused by Connect before decoding.
		_, err = c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, &cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n",
			Hosts: []string{"x.com"}, Value: strings.Repeat("v", 425001)}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("oversized: %v", err)
		}
		setEntitlements(t, e, true, false)
		_, err = c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, req))
		wantConnectError(t, err, connect.CodeUnavailable, 503, "vault_writes_disabled")
		setEntitlements(t, e, false, true)
		_, err = c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, req))
		wantConnectError(t, err, connect.CodeNotFound, 404, "")
		if counts(t, e) != before {
			t.Fatalf("refused calls wrote rows: %s, want %s", counts(t, e), before)
		}
	})
}

func TestConnectDoorRefusesRegionalHostnames(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := testenv.New(t, db, func(s *server.Server) { s.Vault.RegionalHosts = []string{"eu.api.example.com"} })
		// The Host header is the regional name; the connection goes to the test server.
		client := &http.Client{Transport: hostRewriter{host: "eu.api.example.com", next: e.HTTPClient().Transport}}
		c := cohortv1connect.NewVaultServiceClient(client, e.URL)
		_, err := c.PutInternSecret(context.Background(), connectPut(e.WorkspaceKey,
			&cohortv1.PutInternSecretRequest{InternId: e.InternID, Name: "n", Hosts: []string{"x.com"}, Value: "v"}))
		wantConnectError(t, err, connect.CodePermissionDenied, 403, "regional_host")
		if got := counts(t, e); got != "vaults=0 vault_secrets=0 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}

type hostRewriter struct {
	host string
	next http.RoundTripper
}

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	next := h.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}
