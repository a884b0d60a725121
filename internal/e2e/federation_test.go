package e2e_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cohort-dev/cohort/internal/testutil"
)

// An identity provider on a private address (loopback here) works once the
// operator lists it with --federation-allow-hosts; a gateway without the
// setting refuses to fetch its keys. Both gateways share one database.
func TestExchangeWithAnAllowedPrivateIssuer(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(n *big.Int) string { return base64.RawURLEncoding.EncodeToString(n.FillBytes(make([]byte, 32))) }
	var idp *httptest.Server
	idp = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			json.NewEncoder(w).Encode(map[string]string{"issuer": idp.URL, "jwks_uri": idp.URL + "/jwks"})
		case "/jwks":
			json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{"kty": "EC", "crv": "P-256", "kid": "k1",
				"alg": "ES256", "use": "sig", "x": b64(key.X), "y": b64(key.Y)}}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer idp.Close()
	caFile := filepath.Join(t.TempDir(), "idp.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: idp.Certificate().Raw}), 0o600)

	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	allowed := c.Gateway(t, "--extra-ca-file", caFile, "--federation-allow-hosts", "127.0.0.1/32")
	c.load(t)
	plain := c.Gateway(t, "--no-bootstrap", "--extra-ca-file", caFile)

	keys, err := c.admin("key", "list", "--org", c.Org, "--json")
	if err != nil {
		t.Fatal(err)
	}
	keyID := ""
	var list []map[string]any
	json.Unmarshal(keys, &list)
	for _, k := range list {
		if k["kind"] == "workspace" {
			keyID, _ = k["id"].(string)
		}
	}
	if keyID == "" {
		t.Fatalf("no workspace key in %s", keys)
	}
	// The admin CLI checks the issuer against the egress policy when it is
	// saved, so it is told the same allowlist as the gateway that uses it.
	iss := c.Admin(t, "federation", "issuer-create", "--org", c.Org, "--name", "internal idp", "--issuer-url", idp.URL,
		"--federation-allow-hosts", "127.0.0.1/32", "--extra-ca-file", caFile)
	issID, _ := iss["id"].(string)
	if issID == "" {
		issID, _ = iss["issuer"].(map[string]any)["id"].(string)
	}
	pol := c.Admin(t, "federation", "policy-create", "--org", c.Org, "--issuer", issID, "--audience", "cohort", "--api-key", keyID, "--subject", "workload-1")
	polID, _ := pol["id"].(string)
	if polID == "" {
		polID, _ = pol["policy"].(map[string]any)["id"].(string)
	}

	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": idp.URL, "aud": "cohort", "sub": "workload-1",
		"iat": time.Now().Unix(), "exp": time.Now().Add(5 * time.Minute).Unix()})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	exchange := func(gw *proc) (int, string) {
		form := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
			"subject_token_type": {"urn:ietf:params:oauth:token-type:jwt"}, "subject_token": {signed}, "federation_policy_id": {polID}}
		res, err := http.PostForm(gw.URL+"/api/v1/oauth/token", form)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	// Refused by the policy: invalid_grant, not 503 "retry shortly".
	if st, body := exchange(plain); st != 400 || !strings.Contains(body, `"invalid_grant"`) {
		t.Fatalf("a gateway without the allowlist: want 400 invalid_grant, got %d %s", st, body)
	}
	st, body := exchange(allowed)
	if st != 200 || !strings.Contains(body, `"access_token"`) {
		t.Fatalf("exchange against the allowed issuer: %d %s", st, body)
	}
	var out map[string]any
	json.Unmarshal([]byte(body), &out)
	// The access token is the workspace key's bearer for the chat.
	token := fmt.Sprint(out["access_token"])
	res := chat(t, allowed, token, c.Demo, user("hello"))
	res.Body.Close()
	if res.StatusCode == 401 || res.StatusCode == 403 {
		t.Fatalf("the access token does not act as the workspace key: %d", res.StatusCode)
	}
	// And for background runs: a CI job holding only its token starts one,
	// follows it and reads its events (it got 403 before).
	res = chat(t, allowed, token, c.Demo, user("hello from ci", `"background":true`))
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var run map[string]any
	if err := json.Unmarshal(raw, &run); err != nil || res.StatusCode != 202 {
		t.Fatalf("a background run with the access token: %d %s", res.StatusCode, raw)
	}
	id, _ := run["id"].(string)
	testutil.Eventually(t, wait, "the run ends", func() bool {
		run = getRun(t, allowed, token, c.Demo, id)
		return run["status"] != "running"
	})
	if run["status"] != "completed" {
		t.Fatalf("the token's run: %v", run)
	}
	if evs := runEvents(t, allowed, token, c.Demo, id, 0); len(evs) == 0 || !strings.Contains(evs[len(evs)-1].data, `"usage"`) {
		t.Fatalf("the token's run events: %v", evs)
	}
}
