package vault_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

var fingerprintRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestPutCreatesThenReplaces(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		first := mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"API.Example.com.", "api.example.com", "other.example.com"}, "s3cr3t-one", 201)
		if first.Name != "api_key" || strings.Join(first.Hosts, ",") != "api.example.com,other.example.com" {
			t.Fatalf("created: %+v", first)
		}
		if first.Fingerprint == nil || !fingerprintRE.MatchString(*first.Fingerprint) {
			t.Fatalf("fingerprint: %v", first.Fingerprint)
		}
		created, err := time.Parse(time.RFC3339Nano, first.CreatedAt)
		if err != nil || time.Since(created) > time.Minute || created.Location() != time.UTC {
			t.Fatalf("created_at %q: %v", first.CreatedAt, err)
		}

		// Rewriting the same value keeps the fingerprint and created_at; 200.
		again := mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"new.example.com"}, "s3cr3t-one", 200)
		if *again.Fingerprint != *first.Fingerprint || again.CreatedAt != first.CreatedAt {
			t.Fatalf("replace with same value: %+v vs %+v", again, first)
		}
		if strings.Join(again.Hosts, ",") != "new.example.com" {
			t.Fatalf("replace sets hosts: %v", again.Hosts)
		}
		// Another value: another fingerprint.
		other := mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"new.example.com"}, "s3cr3t-two", 200)
		if *other.Fingerprint == *first.Fingerprint {
			t.Fatal("different values share a fingerprint")
		}
		// Equal values in one vault, under another name: equal fingerprints.
		twin := mustPut(t, e, e.WorkspaceKey, e.InternID, "twin", []string{"x.example.com"}, "s3cr3t-two", 201)
		if *twin.Fingerprint != *other.Fingerprint {
			t.Fatal("equal values in one vault have different fingerprints")
		}
		// The same value in another intern's vault: another fingerprint.
		in2 := newIntern(t, e, e.WorkspaceID)
		elsewhere := mustPut(t, e, e.WorkspaceKey, in2, "twin", []string{"x.example.com"}, "s3cr3t-two", 201)
		if *elsewhere.Fingerprint == *twin.Fingerprint {
			t.Fatal("the same value in two vaults has the same fingerprint")
		}
		if got := counts(t, e); got != "vaults=2 vault_secrets=3 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
		// One stored row per secret, updated in place.
		row := secretRow(t, e, e.InternID, "api_key")
		if row.UpdatedAt == nil || row.CreatedAt.Format(time.RFC3339Nano) != first.CreatedAt {
			t.Fatalf("row after replace: created %v updated %v", row.CreatedAt, row.UpdatedAt)
		}
	})
}

func TestPersonalKeyActsOnItsActiveWorkspace(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		personal := e.NewKey(t, store.KeyPersonal, e.WorkspaceID)
		mustPut(t, e, personal, e.InternID, "token", []string{"a.example.com"}, "v", 201)
		// Its workspace only: an intern of another workspace is not found.
		ws2, _ := newWorkspace(t, e, "second")
		in2 := newIntern(t, e, ws2)
		st, body := put(t, e, personal, in2, "token", []string{"a.example.com"}, "v")
		wantError(t, st, body, 404, "not_found")
	})
}

// TestPutBounds covers every bound at its limit and one past it, and every
// malformed input, on both stores. Nothing refused writes a row.
func TestPutBounds(t *testing.T) {
	t.Parallel()
	label63 := strings.Repeat("a", 63)
	host253 := label63 + "." + label63 + "." + label63 + "." + strings.Repeat("b", 61)
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ok := []struct {
			what  string
			name  string
			hosts []string
			value string
		}{
			{"name of 1 character", "a", []string{"x.com"}, "v"},
			{"name of 255 characters", "n" + strings.Repeat("_x", 127), []string{"x.com"}, "v"},
			{"100 hosts", "hosts_100", hostsN(100), "v"},
			{"host of 254 characters ending in a dot", "host_254", []string{host253 + "."}, "v"},
			{"host of 253 characters", "host_253", []string{host253}, "v"},
			{"value of 1 character", "value_1", []string{"x.com"}, "v"},
			{"value of 65536 characters", "value_max", []string{"x.com"}, strings.Repeat("v", 65536)},
			{"value of 65536 multibyte characters", "value_max_mb", []string{"x.com"}, strings.Repeat("é", 65535) + "😀"},
		}
		for i, c := range ok {
			s := mustPut(t, e, e.WorkspaceKey, e.InternID, c.name, c.hosts, c.value, 201)
			if s.Name != c.name {
				t.Fatalf("%s: %+v", c.what, s)
			}
			if want := "vaults=1 vault_secrets=" + string(rune('1'+i)) + " vault_releases=0"; counts(t, e) != want {
				t.Fatalf("%s: rows %s, want %s", c.what, counts(t, e), want)
			}
		}
		if n := len(mustPut(t, e, e.WorkspaceKey, e.InternID, "hosts_100", hostsN(100), "v", 200).Hosts); n != 100 {
			t.Fatalf("100 hosts stored as %d", n)
		}
		before := counts(t, e)

		ws2, _ := newWorkspace(t, e, "other")
		otherWorkspaceIntern := newIntern(t, e, ws2)
		deleted := newIntern(t, e, e.WorkspaceID)
		if _, err := e.Server.Interns.Delete(context.Background(), e.Operator(), deleted); err != nil {
			t.Fatal(err)
		}
		missing := "00000000-0000-4000-8000-000000000000"

		bad := []struct {
			what      string
			intern    string
			name      string
			body      string
			status    int
			reason    string
			fragments []string
		}{
			{"name of 256 characters", e.InternID, "n" + strings.Repeat("x", 255), putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"1 to 255"}},
			{"name A", e.InternID, "A", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"lowercase letter"}},
			{"name _a", e.InternID, "_a", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"lowercase letter"}},
			{"name a_", e.InternID, "a_", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"underscore"}},
			{"name a__b", e.InternID, "a__b", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"two underscores"}},
			{"name 1a", e.InternID, "1a", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"lowercase letter"}},
			{"name with an escaped slash", e.InternID, "a%2Fb", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"only lowercase"}},
			{"no hosts", e.InternID, "n", putBody(t, []string{}, "v"), 400, "bad_request", []string{"1 to 100 entries, got 0"}},
			{"hosts null", e.InternID, "n", `{"hosts":null,"value":"v"}`, 400, "bad_request", []string{"1 to 100 entries"}},
			{"hosts missing", e.InternID, "n", `{"value":"v"}`, 400, "bad_request", []string{"1 to 100 entries"}},
			{"101 hosts", e.InternID, "n", putBody(t, hostsN(101), "v"), 400, "bad_request", []string{"1 to 100 entries, got 101"}},
			{"host of 255 characters", e.InternID, "n", putBody(t, []string{"x.com", host253 + ".."}, "v"), 400, "bad_request", []string{"hosts[1]", "255 characters", "at most 254"}},
			{"host of 254 characters without a trailing dot", e.InternID, "n", putBody(t, []string{host253 + "c"}, "v"), 400, "bad_request", []string{"hosts[0]", "253"}},
			{"scheme", e.InternID, "n", putBody(t, []string{"https://x.com"}, "v"), 400, "bad_request", []string{`hosts[0] "https://x.com"`, "schemes"}},
			{"port", e.InternID, "n", putBody(t, []string{"x.com:443"}, "v"), 400, "bad_request", []string{`hosts[0] "x.com:443"`, "ports"}},
			{"path", e.InternID, "n", putBody(t, []string{"x.com/p"}, "v"), 400, "bad_request", []string{`"x.com/p"`, "paths"}},
			{"wildcard", e.InternID, "n", putBody(t, []string{"a.com", "*.x.com"}, "v"), 400, "bad_request", []string{`hosts[1] "*.x.com"`, "wildcards"}},
			{"empty host", e.InternID, "n", putBody(t, []string{""}, "v"), 400, "bad_request", []string{`hosts[0] ""`, "empty"}},
			{"null host", e.InternID, "n", `{"hosts":[null],"value":"v"}`, 400, "bad_request", []string{"hosts[0]", "empty"}},
			{"IP literal", e.InternID, "n", putBody(t, []string{"127.0.0.1"}, "v"), 400, "bad_request", []string{"IP addresses"}},
			{"hex IP", e.InternID, "n", putBody(t, []string{"0x7f.1"}, "v"), 400, "bad_request", []string{"IP addresses"}},
			{"decimal IP", e.InternID, "n", putBody(t, []string{"2130706433"}, "v"), 400, "bad_request", []string{"hosts[0]"}},
			{"IPv6", e.InternID, "n", putBody(t, []string{"[::1]"}, "v"), 400, "bad_request", []string{"IP addresses"}},
			{"empty label", e.InternID, "n", putBody(t, []string{"a..b"}, "v"), 400, "bad_request", []string{"empty label"}},
			{"invisible character", e.InternID, "n", putBody(t, []string{"x\u200b.com"}, "v"), 400, "bad_request", []string{`"x\u200b.com"`, "IDNA"}},
			{"host not a string", e.InternID, "n", `{"hosts":[1],"value":"v"}`, 400, "bad_request", []string{"hosts"}},
			{"empty value", e.InternID, "n", putBody(t, []string{"x.com"}, ""), 400, "bad_request", []string{"1 to 65536 characters, got 0"}},
			{"value missing", e.InternID, "n", `{"hosts":["x.com"]}`, 400, "bad_request", []string{"1 to 65536"}},
			{"value of 65537 characters", e.InternID, "n", putBody(t, []string{"x.com"}, strings.Repeat("v", 65537)), 400, "bad_request", []string{"got 65537"}},
			{"value of 65537 multibyte characters", e.InternID, "n", putBody(t, []string{"x.com"}, strings.Repeat("é", 65536)+"😀"), 400, "bad_request", []string{"got 65537"}},
			{"value not a string", e.InternID, "n", `{"hosts":["x.com"],"value":42}`, 400, "bad_request", []string{`"value" must be a string`}},
			{"unknown field", e.InternID, "n", `{"hosts":["x.com"],"value":"v","ttl":3}`, 400, "bad_request", []string{`unknown field "ttl"`}},
			{"field in another case", e.InternID, "n", `{"Hosts":["x.com"],"value":"v"}`, 400, "bad_request", []string{`unknown field "Hosts"`}},
			{"duplicate field", e.InternID, "n", `{"hosts":["x.com"],"value":"v","value":"w"}`, 400, "bad_request", []string{"duplicate"}},
			{"malformed JSON", e.InternID, "n", `{"hosts":["x.com"],`, 400, "bad_request", []string{"malformed"}},
			{"not an object", e.InternID, "n", `["x.com"]`, 400, "bad_request", []string{"JSON object"}},
			{"empty body", e.InternID, "n", ``, 400, "bad_request", []string{"empty"}},
			{"non-UUID intern id", "demo", "n", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"intern id must be a UUID"}},
			{"UUID in braces", "{" + e.InternID + "}", "n", putBody(t, []string{"x.com"}, "v"), 400, "bad_request", []string{"UUID"}},
			{"missing intern", missing, "n", putBody(t, []string{"x.com"}, "v"), 404, "not_found", nil},
			{"intern of another workspace", otherWorkspaceIntern, "n", putBody(t, []string{"x.com"}, "v"), 404, "not_found", nil},
			{"deleted intern", deleted, "n", putBody(t, []string{"x.com"}, "v"), 404, "not_found", nil},
		}
		notFound := map[string]string{}
		for _, c := range bad {
			st, body, _ := e.Do(t, "PUT", secretPath(c.intern, c.name), e.WorkspaceKey, "application/json", c.body)
			t.Run(c.what, func(t *testing.T) { wantError(t, st, body, c.status, c.reason, c.fragments...) })
			if got := counts(t, e); got != before {
				t.Fatalf("%s wrote rows: %s, want %s", c.what, got, before)
			}
			if c.status == 404 {
				// Indistinguishable: the same body whatever the reason.
				notFound[c.what] = strings.ReplaceAll(body, c.intern, "ID")
			}
		}
		if notFound["missing intern"] != notFound["intern of another workspace"] || notFound["missing intern"] != notFound["deleted intern"] {
			t.Fatalf("404 bodies differ: %v", notFound)
		}
		// The uppercase spelling of an existing id is the same intern.
		mustPut(t, e, e.WorkspaceKey, strings.ToUpper(e.InternID), "upper", []string{"x.com"}, "v", 201)
	})
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		// Pad with whitespace, which JSON allows, to exactly the bound.
		body := putBody(t, []string{"x.com"}, "v")
		at := body + strings.Repeat(" ", 425000-len(body))
		st, resp, _ := e.Do(t, "PUT", secretPath(e.InternID, "padded"), e.WorkspaceKey, "application/json", at)
		if st != 201 {
			t.Fatalf("body of 425000 bytes: %d %s", st, resp)
		}
		st, resp, _ = e.Do(t, "PUT", secretPath(e.InternID, "padded_more"), e.WorkspaceKey, "application/json", at+" ")
		wantError(t, st, resp, 413, "payload_too_large", "425000")
		if got := counts(t, e); got != "vaults=1 vault_secrets=1 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}

// TestConcurrentFirstWrites: many writers racing to create an intern's vault
// and the same secret end with one vault, one row, and every answer 201 or
// 200 (exactly one 201).
func TestConcurrentFirstWrites(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		const n = 8
		statuses := make(chan int, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("PUT", e.URL+secretPath(e.InternID, "shared"), strings.NewReader(fmt.Sprintf(`{"hosts":["x.com"],"value":"v%d"}`, i)))
				req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
				res, err := e.HTTPClient().Do(req)
				if err != nil {
					statuses <- 0
					return
				}
				res.Body.Close()
				statuses <- res.StatusCode
			}()
		}
		wg.Wait()
		close(statuses)
		created := 0
		for st := range statuses {
			switch st {
			case 201:
				created++
			case 200:
			default:
				t.Fatalf("status %d", st)
			}
		}
		if created != 1 {
			t.Fatalf("%d writers saw 201", created)
		}
		if got := counts(t, e); got != "vaults=1 vault_secrets=1 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
		if _, err := e.Server.Vault.ReleaseSecret(context.Background(), e.InternID, "shared", "x.com"); err != nil {
			t.Fatal(err)
		}
	})
}

// A gzip body is stored as its decompressed JSON, the bound applying to
// what it decompresses to; an encoding the gateway does not speak is a 415
// that stores nothing.
func TestEncodedBodies(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	put := func(name, enc string, body []byte) (int, string) {
		req, _ := http.NewRequest("PUT", e.URL+secretPath(e.InternID, name), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", enc)
		res, err := e.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.Bytes()
	}
	body := putBody(t, []string{"x.com"}, "v")
	if st, resp := put("zipped", "gzip", gz(body)); st != 201 {
		t.Fatalf("gzip body: %d %s", st, resp)
	}
	// Small on the wire, past the 425,000-byte bound once decompressed.
	st, resp := put("bomb", "gzip", gz(body+strings.Repeat(" ", 425001-len(body))))
	wantError(t, st, resp, 413, "payload_too_large", "425000")
	st, resp = put("brotli", "br", []byte(body))
	wantError(t, st, resp, 415, "bad_request", "Content-Encoding")
	if got := counts(t, e); got != "vaults=1 vault_secrets=1 vault_releases=0" {
		t.Fatalf("rows: %s", got)
	}
}
