package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// loopbackIDP is an identity provider on 127.0.0.1 (a non-public address
// the egress policy refuses unless allowed) serving one ES256 key, with
// its certificate in a PEM file for --extra-ca-file and a token it signed.
func loopbackIDP(t *testing.T) (url, caFile, token string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig",
		"x": b64(key.X.FillBytes(make([]byte, 32))), "y": b64(key.Y.FillBytes(make([]byte, 32)))}}})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(jwks) }))
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": srv.URL, "sub": "repo:acme/app", "aud": "cohort",
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(5 * time.Minute).Unix()})
	tok.Header["kid"] = "k1"
	token, err = tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile, token
}

// fedOrg makes an entitled organization with a workspace key; it returns
// the org id and the key id.
func fedOrg(t *testing.T, dir string) (org, keyID string) {
	t.Helper()
	var o, user, ws, key obj
	mustCLI(t, dir, &o, "--init", "org", "create", "--name", "Acme", "--workload-identity")
	org = o["id"].(string)
	mustCLI(t, dir, &user, "user", "create", "--org", org, "--email", "a@acme.test", "--role", "admin")
	mustCLI(t, dir, &ws, "workspace", "create", "--org", org, "--user", user["id"].(string), "--name", "Prod")
	mustCLI(t, dir, &key, "key", "create", "--org", org, "--user", user["id"].(string), "--kind", "workspace", "--workspace", ws["id"].(string))
	return org, key["api_key"].(obj)["id"].(string)
}

// stepOutcome is a dry run's outcome for one check.
func stepOutcome(dry obj, check string) (outcome, detail string) {
	steps, _ := dry["steps"].([]any)
	for _, s := range steps {
		if s := s.(obj); s["check"] == check {
			o, _ := s["outcome"].(string)
			d, _ := s["detail"].(string)
			return o, d
		}
	}
	return "", ""
}

// TestAdminFederationAllowHosts: the admin CLI honours serve's egress
// settings, as flags and as their COHORT_* twins: an issuer on a
// non-public address is refused when created (naming the setting) unless
// --federation-allow-hosts lists it, and a dry run fetches its keys only
// when allowed.
func TestAdminFederationAllowHosts(t *testing.T) {
	// Not parallel: the second half sets the environment.
	idpURL, caFile, token := loopbackIDP(t)
	for _, viaEnv := range []bool{false, true} {
		dir := t.TempDir()
		o, keyID := fedOrg(t, dir)
		allow := []string{"--federation-allow-hosts", "127.0.0.1", "--extra-ca-file", caFile}
		if viaEnv {
			t.Setenv("COHORT_FEDERATION_ALLOW_HOSTS", "127.0.0.1")
			t.Setenv("COHORT_EXTRA_CA_FILE", caFile)
			allow = nil
		}
		create := []string{"federation", "issuer-create", "--org", o, "--name", "local", "--issuer-url", idpURL, "--jwks-url", idpURL + "/jwks"}
		if !viaEnv {
			err := fedCLI(t, dir, nil, create...)
			if err == nil || !strings.Contains(err.Error(), "--federation-allow-hosts") || !strings.Contains(err.Error(), "egress policy") {
				t.Fatalf("issuer on loopback, not allowed: %v", err)
			}
		}
		var iss, pol, dry obj
		mustCLI(t, dir, &iss, append(create, allow...)...)
		mustCLI(t, dir, &pol, "federation", "policy-create", "--org", o, "--issuer", iss["id"].(string), "--audience", "cohort",
			"--api-key", keyID, "--subject", "repo:acme/app")
		mustCLI(t, dir, &dry, append([]string{"federation", "dry-run", "--org", o, "--id", pol["id"].(string), "--token", token}, allow...)...)
		if out, d := stepOutcome(dry, "issuer_keys"); out != "passed" {
			t.Fatalf("env=%v: allowed dry run: issuer_keys %s %q (%v)", viaEnv, out, d, dry)
		}
		if out, d := stepOutcome(dry, "signature"); out != "passed" {
			t.Fatalf("env=%v: allowed dry run: signature %s %q", viaEnv, out, d)
		}
		if viaEnv {
			// The flag, given empty, overrides the environment.
			allow = []string{"--federation-allow-hosts", ""}
		} else {
			allow = []string{"--extra-ca-file", caFile}
		}
		dry = nil
		mustCLI(t, dir, &dry, append([]string{"federation", "dry-run", "--org", o, "--id", pol["id"].(string), "--token", token}, allow...)...)
		if out, d := stepOutcome(dry, "issuer_keys"); out != "failed" || !strings.Contains(d, "egress policy") {
			t.Fatalf("env=%v: dry run not allowed: issuer_keys %s %q", viaEnv, out, d)
		}
	}
}
