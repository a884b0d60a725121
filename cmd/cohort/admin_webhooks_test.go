package main

import (
	"strings"
	"testing"
)

// The operator's webhook commands: create (the secret, once, and the
// egress policy at save), get (no secret), update, rotate, the delivery
// log, delete.
func TestAdminWebhookCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var org, user, ws, ep, got, rot obj
	mustCLI(t, dir, &org, "--init", "org", "create", "--name", "Acme", "--interns-programme")
	o := org["id"].(string)
	mustCLI(t, dir, &user, "user", "create", "--org", o, "--email", "a@acme.test", "--role", "admin")
	mustCLI(t, dir, &ws, "workspace", "create", "--org", o, "--user", user["id"].(string), "--name", "Prod")
	w := ws["id"].(string)

	err := fedCLI(t, dir, nil, "--init", "webhook", "create", "--org", o, "--workspace", w, "--url", "http://127.0.0.1:9/hook", "--events", "run.paused")
	if err == nil || !strings.Contains(err.Error(), "--webhook-allow-hosts") {
		t.Fatalf("loopback receiver without the setting: %v", err)
	}
	mustCLI(t, dir, &ep, "webhook", "create", "--org", o, "--workspace", w, "--url", "http://127.0.0.1:9/hook",
		"--events", "run.paused,run.failed", "--description", "ci", "--webhook-allow-hosts", "127.0.0.0/8")
	secret, _ := ep["secret"].(string)
	id := ep["endpoint"].(obj)["id"].(string)
	if !strings.HasPrefix(secret, "whsec_") {
		t.Fatalf("create: %v", ep)
	}
	mustCLI(t, dir, &got, "webhook", "update", "--org", o, "--id", id, "--enabled", "false", "--events", "run.completed")
	if got["enabled"] == true || got["events"].([]any)[0] != "run.completed" || got["secret"] != nil {
		t.Fatalf("update: %v", got)
	}
	mustCLI(t, dir, &rot, "webhook", "rotate-secret", "--org", o, "--id", id)
	if s, _ := rot["secret"].(string); !strings.HasPrefix(s, "whsec_") || s == secret {
		t.Fatalf("rotate: %v", rot)
	}
	mustCLI(t, dir, &got, "webhook", "get", "--org", o, "--id", id)
	if got["secret"] != nil || got["secret_rotated_at"] == nil {
		t.Fatalf("get: %v", got)
	}
	var list []any
	mustCLI(t, dir, &list, "webhook", "deliveries", "--org", o, "--id", id)
	mustCLI(t, dir, &got, "webhook", "delete", "--org", o, "--id", id)
	if err := fedCLI(t, dir, nil, "webhook", "get", "--org", o, "--id", id); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("after delete: %v", err)
	}
}
