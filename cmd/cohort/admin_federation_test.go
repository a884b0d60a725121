package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// cli runs `cohort admin …` against the SQLite database in dir and decodes
// its --json output into out.
func fedCLI(t *testing.T, dir string, out any, args ...string) error {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append(append([]string{"admin"}, args...), "--data-dir", dir, "--json"), &stdout, &stderr)
	if err == nil && out != nil {
		if jerr := json.Unmarshal(stdout.Bytes(), out); jerr != nil {
			t.Fatalf("%v: output %q: %v", args, stdout.String(), jerr)
		}
	}
	return err
}

func mustCLI(t *testing.T, dir string, out any, args ...string) {
	t.Helper()
	if err := fedCLI(t, dir, out, args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

type obj = map[string]any

func TestAdminFederationCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var org, user, ws, key, iss, pol obj
	mustCLI(t, dir, &org, "--init", "org", "create", "--name", "Acme", "--workload-identity")
	o := org["id"].(string)
	mustCLI(t, dir, &user, "user", "create", "--org", o, "--email", "a@acme.test", "--role", "admin")
	u := user["id"].(string)
	mustCLI(t, dir, &ws, "workspace", "create", "--org", o, "--user", u, "--name", "Prod")
	mustCLI(t, dir, &key, "key", "create", "--org", o, "--user", u, "--kind", "workspace", "--workspace", ws["id"].(string))
	keyID := key["api_key"].(obj)["id"].(string)

	mustCLI(t, dir, &iss, "federation", "issuer-create", "--org", o, "--name", "GitHub", "--issuer-url", "https://token.actions.githubusercontent.com")
	if iss["issuer_url"] != "https://token.actions.githubusercontent.com" {
		t.Fatalf("issuer %v", iss)
	}
	if err := fedCLI(t, dir, nil, "federation", "issuer-create", "--org", o, "--name", "x", "--issuer-url", "http://insecure.example"); err == nil || !strings.Contains(err.Error(), "https://") {
		t.Fatalf("http issuer: %v", err)
	}
	mustCLI(t, dir, &pol, "federation", "policy-create", "--org", o, "--issuer", iss["id"].(string), "--audience", "cohort",
		"--api-key", keyID, "--subject", "repo:acme/app:ref:refs/heads/main", "--scopes", "deploy", "--token-type", "id")
	p := pol["id"].(string)
	if len(pol["claim_checks"].([]any)) != 2 || pol["enabled"] != true {
		t.Fatalf("policy %v", pol)
	}
	mustCLI(t, dir, &pol, "federation", "claim-remove", "--org", o, "--id", p, "--kind", "scopes")
	if cc := pol["claim_checks"].([]any); len(cc) != 1 || cc[0].(obj)["kind"] != "token_type" {
		t.Fatalf("after claim-remove: %v", pol)
	}
	mustCLI(t, dir, &pol, "federation", "claim-set", "--org", o, "--id", p, "--kind", "scopes", "--value", "ship")
	pol = nil // protojson leaves out false: decode into a fresh map
	mustCLI(t, dir, &pol, "federation", "policy-update", "--org", o, "--id", p, "--enabled", "false")
	if _, on := pol["enabled"]; on || len(pol["claim_checks"].([]any)) != 2 {
		t.Fatalf("paused policy %v", pol)
	}
	if err := fedCLI(t, dir, nil, "federation", "policy-update", "--org", o, "--id", p, "--subject", ""); err == nil || !strings.Contains(err.Error(), "subject, a condition, or both") {
		t.Fatalf("clearing the only rule: %v", err)
	}
	var v obj
	mustCLI(t, dir, &v, "federation", "condition-validate", "--org", o, "--condition", `subject.matches("^repo:")`)
	if v["valid"] == true || !strings.Contains(v["message"].(string), "matches()") {
		t.Fatalf("validate %v", v)
	}
	var dry obj
	mustCLI(t, dir, &dry, "federation", "dry-run", "--org", o, "--id", p, "--token", "not-a-jwt")
	if dry["failed_check"] != "token_format" {
		t.Fatalf("dry run %v", dry)
	}
	var list []obj
	mustCLI(t, dir, &list, "federation", "policy-list", "--org", o)
	if len(list) != 1 {
		t.Fatalf("policies %v", list)
	}
	mustCLI(t, dir, &list, "federation", "exchanges", "--org", o)
	if len(list) != 0 {
		t.Fatalf("exchanges %v", list)
	}
	var del obj
	mustCLI(t, dir, &del, "federation", "issuer-delete", "--org", o, "--id", iss["id"].(string))
	if del["deleted_policies"] != float64(1) {
		t.Fatalf("delete %v", del)
	}
}
