package federation_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/proto"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// verifyIssued checks an access token the way a resource server would:
// against the published JWKS, with typ, alg, kid and every claim.
func verifyIssued(t *testing.T, f *fed, token string) jwt.MapClaims {
	t.Helper()
	status, body, _ := f.Do(t, http.MethodGet, "/oauth/jwks", "", "", "")
	if status != http.StatusOK {
		t.Fatalf("jwks: %d %s", status, body)
	}
	kf, err := keyfunc.NewJWKSetJSON(json.RawMessage(body))
	if err != nil {
		t.Fatalf("our JWKS does not load in keyfunc: %v", err)
	}
	claims := jwt.MapClaims{}
	parsed, err := jwt.NewParser(jwt.WithValidMethods([]string{"ES256"}), jwt.WithExpirationRequired(),
		jwt.WithIssuer("cohort"), jwt.WithAudience("cohort"), jwt.WithIssuedAt()).ParseWithClaims(token, claims, kf.Keyfunc)
	if err != nil {
		t.Fatalf("issued token does not verify against /oauth/jwks: %v", err)
	}
	if parsed.Header["typ"] != "at+jwt" || parsed.Header["alg"] != "ES256" || parsed.Header["kid"] == "" {
		t.Fatalf("header %v", parsed.Header)
	}
	for _, c := range []string{"iss", "sub", "aud", "iat", "exp", "jti", "client_id", "scope", "federation_policy_id", "federation_issuer_id"} {
		if _, ok := claims[c]; !ok {
			t.Fatalf("claim %s missing: %v", c, claims)
		}
	}
	if claims["scope"] != "inference" || claims["client_id"] != f.keyID {
		t.Fatalf("claims %v", claims)
	}
	return claims
}

func TestExchangeIssuesAccessToken(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		for _, kid := range []string{kidRSA, kidEC} {
			c := p.claims()
			tok, expiresIn := issued(t, f.exchange(t, p.token(t, kid, c)))
			if expiresIn != 900 {
				t.Fatalf("%s: expires_in %d, want 900 for a subject token with an hour left", kid, expiresIn)
			}
			claims := verifyIssued(t, f, tok)
			if claims["sub"] != c["sub"] || claims["federation_policy_id"] != f.policyID || claims["federation_issuer_id"] != f.issuerID {
				t.Fatalf("claims %v", claims)
			}
			if exp, iat := claims["exp"].(float64), claims["iat"].(float64); exp-iat != 900 {
				t.Fatalf("lifetime %v", exp-iat)
			}
		}
		// The documented optional fields are accepted, audience and
		// resource ignored (even repeated).
		issued(t, f.exchange(t, p.token(t, kidRSA, p.claims()), "requested_token_type", "urn:ietf:params:oauth:token-type:access_token",
			"scope", "inference", "audience", "x", "audience", "y", "resource", "https://r.example", "client_id", "ignored"))

		// Lifetime never beyond the subject token's.
		c := p.claims()
		c["exp"] = time.Now().Unix() + 120
		tok, expiresIn := issued(t, f.exchange(t, p.token(t, kidRSA, c)))
		if expiresIn < 118 || expiresIn > 120 {
			t.Fatalf("expires_in %d for a subject token with 120 s left", expiresIn)
		}
		claims := verifyIssued(t, f, tok)
		if claims["exp"].(float64) > float64(c["exp"].(int64)) {
			t.Fatalf("access token exp %v after subject exp %v", claims["exp"], c["exp"])
		}
		// exp as a float (a NumericDate may have a fraction).
		c = p.claims()
		c["exp"] = float64(time.Now().Unix()) + 600.75
		if _, n := issued(t, f.exchange(t, p.token(t, kidRSA, c))); n < 598 || n > 600 {
			t.Fatalf("float exp: expires_in %d", n)
		}
		// Neither the subject token nor the access token reaches the log.
		if strings.Contains(f.Logs(), tok[strings.LastIndex(tok, ".")+1:]) {
			t.Fatal("an access token reached the log")
		}
		// The audit lists the issued exchanges with their token ids.
		rows := f.audit(t)
		if len(rows) != 5 {
			t.Fatalf("%d audit rows, want 5", len(rows))
		}
		for _, r := range rows {
			if r.GetOutcome() != "issued" || r.GetTokenId() == "" || r.GetSubject() != "repo:acme/app:ref:refs/heads/main" ||
				r.GetApiKeyId() != f.keyID || r.GetSourceAddress() != "127.0.0.1" {
				t.Fatalf("audit row %v", r)
			}
		}
	})
}

// TestAccessTokenUse: the token acts as the target key; the key's state is
// read on every request; routes other than inference refuse it.
func TestAccessTokenUse(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		// The intern chat is the inference route. No daemon runs in this
		// test, so a token that authenticates reaches the intern gate and
		// gets 409 intern_not_ready, where a refused one gets 401 or 403.
		f := newFed(t, db, p)
		tok, _ := issued(t, f.exchange(t, p.token(t, kidRSA, p.claims())))
		pr, err := f.Server.Auth.Bearer(context.Background(), "Bearer "+tok)
		if err != nil {
			t.Fatal(err)
		}
		if !pr.AccessToken || pr.KeyID != f.keyID || pr.KeyKind != "workspace" || pr.WorkspaceID != f.WorkspaceID {
			t.Fatalf("principal %+v", pr)
		}
		chatPath := "/interns/" + f.InternID + "/chat/completions"
		chatBody := `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		chatREST := func() (int, string) {
			status, body, _ := f.Do(t, http.MethodPost, chatPath, tok, "application/json", chatBody)
			return status, body
		}
		if status, body := chatREST(); status != http.StatusConflict || !strings.Contains(body, `"intern_not_ready"`) {
			t.Fatalf("chat (REST) with an access token: %d %s", status, body)
		}
		chat := cohortv1connect.NewChatServiceClient(f.HTTPClient(), f.URL)
		chatConnect := func() error {
			req := connect.NewRequest(&cohortv1.StreamChatCompletionRequest{InternId: f.InternID,
				Messages: []*cohortv1.ChatMessage{{Role: "user", Content: proto.String("hi")}}})
			req.Header().Set("Authorization", "Bearer "+tok)
			st, err := chat.StreamChatCompletion(context.Background(), req)
			if err != nil {
				return err
			}
			defer st.Close()
			for st.Receive() {
			}
			return st.Err()
		}
		if err := chatConnect(); apierr.FromConnect(err).Reason != "intern_not_ready" {
			t.Fatalf("chat (Connect) with an access token: %v", err)
		}
		ws := cohortv1connect.NewWorkspaceServiceClient(f.HTTPClient(), f.URL)

		// Everything else refuses it with 403.
		admin := cohortv1connect.NewAdminServiceClient(f.HTTPClient(), f.URL)
		interns := cohortv1connect.NewInternServiceClient(f.HTTPClient(), f.URL)
		for name, err := range map[string]error{
			"workspace create": second(try(ws.CreateWorkspace, tok, &cohortv1.CreateWorkspaceRequest{})),
			"workspace list":   second(try(ws.ListWorkspaces, tok, &cohortv1.ListWorkspacesRequest{})),
			"workspace get":    second(try(ws.GetWorkspace, tok, &cohortv1.GetWorkspaceRequest{Id: f.WorkspaceID})),
			"admin":            second(try(admin.ListApiKeys, tok, &cohortv1.ListApiKeysRequest{})),
			"interns":          second(try(interns.ListInterns, tok, &cohortv1.ListInternsRequest{WorkspaceId: f.WorkspaceID})),
			"federation":       second(try(f.client.ListPolicies, tok, &cohortv1.ListPoliciesRequest{})),
		} {
			if connectCode(err) != "permission_denied" {
				t.Errorf("%s with an access token: %v, want permission_denied", name, err)
			}
		}
		status, body, _ := f.Do(t, http.MethodPost, "/workspaces", tok, "application/json", `{"name":"x"}`)
		if status != http.StatusForbidden || !strings.Contains(body, "access tokens") {
			t.Fatalf("REST workspace create with an access token: %d %s", status, body)
		}

		// Disable the target key: the token stops working on the next
		// request, and works again when the key is enabled.
		acc := &accounts.Service{DB: db}
		if _, err := acc.DisableAPIKey(context.Background(), f.Operator(), f.keyID); err != nil {
			t.Fatal(err)
		}
		if status, body := chatREST(); status != http.StatusUnauthorized {
			t.Fatalf("token of a disabled key on chat (REST): %d %s", status, body)
		}
		if err := chatConnect(); connectCode(err) != "unauthenticated" {
			t.Fatalf("token of a disabled key on chat (Connect): %v", err)
		}
		// While the key is disabled, exchanges are refused too.
		expectError(t, f.exchange(t, p.token(t, kidRSA, p.claims())), 400, "invalid_grant")
		acc.EnableAPIKey(context.Background(), f.Operator(), f.keyID)
		if status, body := chatREST(); status != http.StatusConflict {
			t.Fatalf("token after re-enabling: %d %s", status, body)
		}
		acc.DeleteAPIKey(context.Background(), f.Operator(), f.keyID)
		if status, body := chatREST(); status != http.StatusUnauthorized {
			t.Fatalf("token of a deleted key: %d %s", status, body)
		}

		// Tampered, foreign or oversized tokens are 401.
		forged := tok[:len(tok)-4] + "AAAA"
		for name, bad := range map[string]string{
			"tampered":  forged,
			"alg none":  sign(t, `{"alg":"none","typ":"at+jwt"}`, `{"client_id":"`+f.keyID+`"}`, nil),
			"1MB dots":  strings.Repeat(".", 1<<20),
			"two dots":  "a.b.c",
			"subject":   p.token(t, kidRSA, p.claims()),
			"wrong typ": reType(t, tok),
		} {
			if _, err := f.Server.Auth.Bearer(context.Background(), "Bearer "+bad); err == nil {
				t.Errorf("%s access token accepted", name)
			}
		}
	})
}

// reType re-signs nothing: it swaps the header for one with typ JWT, so the
// signature no longer matches either; VerifyAccessToken must refuse.
func reType(t *testing.T, tok string) string {
	parts := strings.Split(tok, ".")
	return b64([]byte(`{"alg":"ES256","typ":"JWT"}`)) + "." + parts[1] + "." + parts[2]
}

func second[T any](_ T, err error) error { return err }

func connectCode(err error) string {
	if err == nil {
		return "ok"
	}
	return connect.CodeOf(err).String()
}
