package e2e_test

import (
	"io"
	"strings"
	"testing"
)

// The two plain refusals (no metadata) produced with real organizations:
// a key whose creator left (403) and an organization outside the interns
// programme (404).
func TestAccessRefusals(t *testing.T) {
	c, gw := newCluster(t, "")
	d := c.Daemon(t, c.Demo, nil)
	plain := func(key string, status int) {
		t.Helper()
		res := chat(t, gw, key, d.id, user("hello"))
		raw, _ := io.ReadAll(res.Body)
		if res.StatusCode != status || strings.Contains(string(raw), "metadata") || !strings.Contains(string(raw), `"code":`) {
			t.Fatalf("want plain %d, got %d %s", status, res.StatusCode, raw)
		}
	}
	newKey := func(org string) (key, creator string) {
		u := c.Admin(t, "user", "create", "--org", org, "--email", "member-"+org[:8]+"@example.com")["id"].(string)
		k := c.Admin(t, "key", "create", "--org", org, "--user", u, "--kind", "personal")
		return k["key"].(string), k["api_key"].(map[string]any)["created_by"].(string)
	}

	in := c.Admin(t, "org", "create", "--name", "Departing", "--interns-programme")["id"].(string)
	key, creator := newKey(in)
	// Before the creator leaves: another organization's intern is 404
	// not_found (with its reason).
	refusal(t, chat(t, gw, key, d.id, user("hello")), 404, "not_found")
	c.Admin(t, "user", "left", "--org", in, "--user", creator)
	plain(key, 403)

	out := c.Admin(t, "org", "create", "--name", "Outside")["id"].(string)
	key, _ = newKey(out)
	plain(key, 404)
}
