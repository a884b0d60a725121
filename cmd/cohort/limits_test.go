package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// `cohort admin intern create|update` set an intern's own limits, on
// SQLite and PostgreSQL: sizes as operators write them, 0 back to the
// operator's, and past the operator's setting refused naming the field.
func TestAdminInternLimits(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]func() []string{
		"sqlite": func() []string { return []string{"--data-dir", t.TempDir()} },
		"postgres": func() []string {
			return []string{"--data-dir", t.TempDir(), "--database-url", storetest.PostgresURL(t)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			db := db()
			run := func(args ...string) (map[string]any, error) {
				t.Helper()
				out, err := cli(t, append(append([]string{"admin"}, args...), append([]string{"--json"}, db...)...)...)
				if err != nil {
					return nil, err
				}
				var m map[string]any
				if err := json.Unmarshal([]byte(out), &m); err != nil {
					t.Fatalf("%v: %v %s", args, err, out)
				}
				return m, nil
			}
			one := func(args ...string) map[string]any {
				t.Helper()
				m, err := run(args...)
				if err != nil {
					t.Fatalf("%v: %v", args, err)
				}
				return m
			}
			org := one("--init", "org", "create", "--name", "Acme", "--interns-programme")["id"].(string)
			uid := one("user", "create", "--org", org, "--email", "ops@acme.test", "--role", "admin")["id"].(string)
			ws := one("workspace", "create", "--org", org, "--user", uid, "--name", "Ops")["id"].(string)
			in := one("intern", "create", "--org", org, "--workspace", ws, "--name", "bot",
				"--memory", "256MiB", "--max-processes", "64", "--cpus", "0.5", "--disk", "1MiB")
			limits := func(m map[string]any) map[string]any {
				l, _ := m["limits"].(map[string]any)
				return l
			}
			want := map[string]any{"memory_bytes": "268435456", "max_processes": float64(64), "cpus": 0.5, "disk_bytes": "1048576"}
			if got := limits(in); !mapsEqual(got, want) {
				t.Fatalf("created with %v, want %v", got, want)
			}
			id := in["id"].(string)
			u := one("intern", "update", "--org", org, "--id", id, "--memory", "0", "--tmpfs", "32MiB", "--cpu-weight", "50")
			want = map[string]any{"max_processes": float64(64), "cpus": 0.5, "disk_bytes": "1048576", "tmpfs_bytes": "33554432", "cpu_weight": float64(50)}
			if got := limits(u); !mapsEqual(got, want) {
				t.Fatalf("updated to %v, want %v", got, want)
			}
			if got := limits(one("intern", "get", "--org", org, "--id", id)); !mapsEqual(got, want) {
				t.Fatalf("get: %v, want %v", got, want)
			}
			// Past the operator's setting (serve's default 4 GiB), and a
			// malformed size: refused, naming what is wrong.
			if _, err := run("intern", "update", "--org", org, "--id", id, "--memory", "5GiB"); err == nil ||
				!strings.Contains(err.Error(), "limits.memory_bytes") || !strings.Contains(err.Error(), "--intern-memory 4GiB") {
				t.Fatalf("past the ceiling: %v", err)
			}
			if _, err := run("intern", "update", "--org", org, "--id", id, "--disk", "lots"); err == nil || !strings.Contains(err.Error(), "--disk") {
				t.Fatalf("malformed size: %v", err)
			}
			if got := limits(one("intern", "get", "--org", org, "--id", id)); !mapsEqual(got, want) {
				t.Fatalf("refused updates changed the limits: %v", got)
			}
		})
	}
}

func mapsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
