package vault_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestValueNeverLeaks drives every path a value can travel (created,
// replaced, refused for each reason, a server fault, both doors, releases
// and refusals) and checks the value appears in no response body, no error
// and no log line.
func TestValueNeverLeaks(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		const secret = "LEAKCANARY9f8e7d6c5b4a"
		var seen []string // every body and error text
		rest := func(method, path, key, body string) {
			_, resp, h := e.Do(t, method, path, key, "application/json", body)
			seen = append(seen, resp, fmt.Sprint(h))
		}
		good := putBody(t, []string{"api.example.com"}, secret)
		path := secretPath(e.InternID, "api_key")

		rest("PUT", path, e.WorkspaceKey, good)                                                                   // created
		rest("PUT", path, e.WorkspaceKey, good)                                                                   // replaced
		rest("PUT", secretPath(e.InternID, "Bad_Name"), e.WorkspaceKey, good)                                     // bad name
		rest("PUT", path, e.WorkspaceKey, putBody(t, []string{"x.com:1"}, secret))                                // bad host
		rest("PUT", path, e.WorkspaceKey, putBody(t, []string{"x.com"}, secret+strings.Repeat("x", 65536)))       // too long
		rest("PUT", path, e.WorkspaceKey, `{"hosts":["x.com"],"value":"`+secret+`","extra":1}`)                   // unknown field
		rest("PUT", path, e.WorkspaceKey, `{"hosts":"`+secret+`","value":"v"}`)                                   // type error
		rest("PUT", path, e.WorkspaceKey, `{"hosts":["x.com"],"value":"`+secret)                                  // truncated JSON
		rest("PUT", path, e.WorkspaceKey, `{"hosts":["x.com"],"value":"`+secret+`"}`+strings.Repeat(" ", 425000)) // too large
		rest("PUT", secretPath("00000000-0000-4000-8000-000000000000", "api_key"), e.WorkspaceKey, good)          // no intern
		rest("PUT", path, e.ManagementKey, good)                                                                  // wrong key kind
		rest("PUT", path, "", good)                                                                               // no key

		c := vaultClient(e)
		for _, req := range []*cohortv1.PutInternSecretRequest{
			{InternId: e.InternID, Name: "api_key", Hosts: []string{"api.example.com"}, Value: secret},
			{InternId: e.InternID, Name: "api_key", Hosts: []string{"*.x.com"}, Value: secret},
			{InternId: e.InternID, Name: "", Hosts: []string{"x.com"}, Value: secret},
		} {
			res, err := c.PutInternSecret(ctx, connectPut(e.WorkspaceKey, req))
			seen = append(seen, fmt.Sprint(res), fmt.Sprint(err))
		}

		for _, host := range []string{"api.example.com", "evil.example.com", "api.example.com:443"} {
			_, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_key", host)
			seen = append(seen, fmt.Sprint(err))
		}

		// A server fault on the write path: the vault's keys no longer open.
		if _, err := e.DB.NewUpdate().Model((*store.Vault)(nil)).Set("data_keyset = ?", []byte("garbage")).
			Where("owner_id = ?", e.InternID).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		rest("PUT", path, e.WorkspaceKey, good)
		_, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_key", "api.example.com")
		seen = append(seen, fmt.Sprint(err))
		if err == nil {
			t.Fatal("released with garbage keys")
		}

		for i, s := range seen {
			if strings.Contains(s, secret) {
				t.Fatalf("the value leaked in output %d: %s", i, s)
			}
		}
		logs := e.Logs()
		if !strings.Contains(logs, "request failed") {
			t.Fatal("the fault was not logged: the log check would prove nothing")
		}
		if strings.Contains(logs, secret) {
			t.Fatalf("the value leaked into the logs:\n%s", logs)
		}
		var audit []store.VaultRelease
		if err := e.DB.NewSelect().Model(&audit).Scan(ctx); err != nil || len(audit) != 4 {
			t.Fatalf("audit: %d %v", len(audit), err)
		}
		if strings.Contains(fmt.Sprint(audit), secret) {
			t.Fatal("the value leaked into the audit")
		}
	})
}
