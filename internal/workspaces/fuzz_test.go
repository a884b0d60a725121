package workspaces_test

import (
	"encoding/json"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// FuzzCreateWorkspace: whatever the body and its Content-Type, the REST
// door answers 201 with the workspace or a 4xx in the family's shape;
// never a 5xx.
func FuzzCreateWorkspace(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"name":"Research"}`, "application/json"},
		{`{"name":"a","io_logging_sampling_rate":0.5,"slug":"a-b"}`, ""},
		{`{"name":"\ud800"}`, "application/json"},
		{"{\"name\":\"\xff\"}", "application/json"},
		{`{"name":`, "application/json"},
		{`[]`, "application/json"},
		{`{"name":"a"}`, "text/plain"},
		{`{"name":"a","io_logging_api_key_ids":["x",1,null]}`, "application/json"},
		{`{"name":1e400}`, "application/json"},
		{``, ""},
	} {
		f.Add(seed[0], seed[1])
	}
	e := testenv.New(f, storetest.SQLite(f))
	f.Fuzz(func(t *testing.T, body, ct string) {
		if !testenv.SendableHeader(ct) {
			t.Skip()
		}
		status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, ct, body)
		switch {
		case status == 201:
			var out map[string]map[string]any
			if err := json.Unmarshal([]byte(resp), &out); err != nil || out["data"]["id"] == nil {
				t.Fatalf("201 without a workspace: %s", resp)
			}
		case status >= 400 && status < 500:
			if err := testenv.ErrorShape(status, resp); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("status %d for %q (%q): %s", status, body, ct, resp)
		}
	})
}
