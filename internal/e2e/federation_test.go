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
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// An identity provider on a private address (loopback here) works once the
// operator lists it with --federation-allow-hosts; a gateway without the
// setting refuses to fetch its keys. Both gateways share one database.
func TestExchangeWithAnAllowedPrivateIssuer(t *testing.T) {
	t.Parallel()
	idp := newTestIdP(t)

	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	allowed := c.Gateway(t, "--extra-ca-file", idp.caFile, "--federation-allow-hosts", "127.0.0.1/32")
	c.load(t)
	plain := c.Gateway(t, "--no-bootstrap", "--extra-ca-file", idp.caFile)

	polID := c.federationPolicy(t, idp)
	signed := idp.sign(t, "workload-1")
	exchange := func(gw *proc) (int, string) { return exchangeAt(t, gw, signed, polID) }
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
	c.Daemon(t, c.Demo, nil)
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

// testIdP is an identity provider on loopback (TLS, one ES256 key) whose
// CA is in caFile.
type testIdP struct {
	url, caFile string
	key         *ecdsa.PrivateKey
}

func newTestIdP(t *testing.T) *testIdP {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(n *big.Int) string { return base64.RawURLEncoding.EncodeToString(n.FillBytes(make([]byte, 32))) }
	var srv *httptest.Server
	srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			json.NewEncoder(w).Encode(map[string]string{"issuer": srv.URL, "jwks_uri": srv.URL + "/jwks"})
		case "/jwks":
			json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{"kty": "EC", "crv": "P-256", "kid": "k1",
				"alg": "ES256", "use": "sig", "x": b64(key.X), "y": b64(key.Y)}}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "idp.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	return &testIdP{url: srv.URL, caFile: caFile, key: key}
}

// sign is a subject token for sub, audience cohort, valid five minutes.
func (p *testIdP) sign(t *testing.T, sub string) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": p.url, "aud": "cohort", "sub": sub,
		"iat": time.Now().Unix(), "exp": time.Now().Add(5 * time.Minute).Unix()})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString(p.key)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

// federationPolicy registers idp as an issuer of c's organization and a
// policy letting its subject workload-1 act as the workspace key; it
// returns the policy's id.
func (c *cluster) federationPolicy(t *testing.T, idp *testIdP) string {
	t.Helper()
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
	iss := c.Admin(t, "federation", "issuer-create", "--org", c.Org, "--name", "internal idp", "--issuer-url", idp.url,
		"--federation-allow-hosts", "127.0.0.1/32", "--extra-ca-file", idp.caFile)
	issID, _ := iss["id"].(string)
	if issID == "" {
		issID, _ = iss["issuer"].(map[string]any)["id"].(string)
	}
	pol := c.Admin(t, "federation", "policy-create", "--org", c.Org, "--issuer", issID, "--audience", "cohort", "--api-key", keyID, "--subject", "workload-1")
	polID, _ := pol["id"].(string)
	if polID == "" {
		polID, _ = pol["policy"].(map[string]any)["id"].(string)
	}
	return polID
}

// exchangeAt posts one token exchange to gw.
func exchangeAt(t *testing.T, gw *proc, subjectToken, policyID string) (int, string) {
	form := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
		"subject_token_type": {"urn:ietf:params:oauth:token-type:jwt"}, "subject_token": {subjectToken}, "federation_policy_id": {policyID}}
	res, err := http.PostForm(gw.URL+"/api/v1/oauth/token", form)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestExchangeAuditSurvivesAKill: the gateway is killed (SIGKILL) while
// four clients exchange tokens; every token a client received has its
// audit row (the audit used to be queued in memory and written up to
// 200 ms later, so a crash lost the record of tokens already issued).
func TestExchangeAuditSurvivesAKill(t *testing.T) {
	t.Parallel()
	idp := newTestIdP(t)
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	args := []string{"--extra-ca-file", idp.caFile, "--federation-allow-hosts", "127.0.0.1/32", "--exchange-rate", "100000/s", "--provisioner", "remote"}
	gw := c.Gateway(t, args...)
	c.load(t)
	polID := c.federationPolicy(t, idp)
	signed := idp.sign(t, "workload-1")

	const target = 100
	var mu sync.Mutex
	issued := map[string]bool{}
	killed := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-killed:
					return
				default:
				}
				st, body := exchangeAt(t, gw, signed, polID)
				if st != 200 {
					continue
				}
				var out struct {
					AccessToken string `json:"access_token"`
				}
				json.Unmarshal([]byte(body), &out)
				claims := jwt.MapClaims{}
				if _, _, err := jwt.NewParser().ParseUnverified(out.AccessToken, claims); err != nil {
					t.Errorf("an issued token does not parse: %v", err)
					return
				}
				mu.Lock()
				issued[fmt.Sprint(claims["jti"])] = true
				n := len(issued)
				mu.Unlock()
				if n >= target {
					// Others are still in flight: kill now.
					once.Do(func() { gw.Kill(); close(killed) })
				}
			}
		}()
	}
	wg.Wait()
	<-gw.done

	rows, err := c.admin("federation", "exchanges", "--org", c.Org, "--limit", "200", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var audit []map[string]any
	if err := json.Unmarshal(rows, &audit); err != nil {
		t.Fatalf("audit: %v %s", err, rows)
	}
	audited := map[string]bool{}
	for _, r := range audit {
		if id, _ := r["tokenId"].(string); id != "" {
			audited[id] = true
		}
		if id, _ := r["token_id"].(string); id != "" {
			audited[id] = true
		}
	}
	if len(issued) < target {
		t.Fatalf("only %d tokens issued before the kill", len(issued))
	}
	for jti := range issued {
		if !audited[jti] {
			t.Errorf("token %s was handed out but has no audit row after the kill (%d issued, %d audited)", jti, len(issued), len(audited))
		}
	}
}
