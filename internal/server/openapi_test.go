package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/openapi"
	"github.com/cohort-dev/cohort/internal/openapi/openapitest"
)

// subtrees are the route table's subtree patterns, which no OpenAPI path
// can describe: each answers only what the document's routes do not
// (the console's files, and 404s or 405s in the API's error shape).
var subtrees = map[string]string{
	"/":                "the console and its files (HTML, not the API)",
	"/api/":            "the API's 404 for any path that is no route",
	Prefix + "/vault/": "the vault's 404, and 405 for a method its routes do not take",
}

// The OpenAPI document and the route table have the same REST routes:
// every route the gateway registers is an operation of the document, and
// every operation of the document is a registered route.
func TestOpenAPIDocumentIsTheRouteTable(t *testing.T) {
	c, err := openapitest.Default()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{} // "METHOD path"
	for _, rt := range (&Server{}).routes() {
		if rt.mount != nil {
			continue // a Connect service: its .proto describes it
		}
		method, path, hasMethod := strings.Cut(rt.pattern, " ")
		if !hasMethod {
			method, path = "", rt.pattern
		}
		if strings.HasSuffix(path, "/") {
			if subtrees[path] == "" {
				t.Errorf("route %q is a subtree pattern the document cannot describe: give it a method and a full path, or list it (with why) in subtrees", rt.pattern)
			}
			continue
		}
		if method == "" {
			// A route that takes every method (/oauth/token, so that a
			// 405 carries the OAuth error body) is documented by the
			// methods it serves.
			item := c.Doc().Paths.Find(path)
			if item == nil || len(item.Operations()) == 0 {
				t.Errorf("route %q is missing from the OpenAPI document", rt.pattern)
				continue
			}
			for m, op := range item.Operations() {
				registered[m+" "+path] = true
				if got, want := schemes(op), wantSchemes[rt.access.Scope]; got != want {
					t.Errorf("route %q admits scope %v; the document's security of %s is [%s], want [%s]", rt.pattern, rt.access.Scope, m, got, want)
				}
			}
			continue
		}
		if !c.Operation(method, path) {
			t.Errorf("route %q is missing from the OpenAPI document", rt.pattern)
			continue
		}
		registered[method+" "+path] = true
		// The document's security is what the route admits.
		if got, want := schemes(c.Doc().Paths.Find(path).GetOperation(method)), wantSchemes[rt.access.Scope]; got != want {
			t.Errorf("route %q admits scope %v; the document's security is [%s], want [%s]", rt.pattern, rt.access.Scope, got, want)
		}
	}
	var extra []string
	for path, item := range c.Doc().Paths.Map() {
		for m := range item.Operations() {
			if !registered[m+" "+path] {
				extra = append(extra, m+" "+path)
			}
		}
	}
	sort.Strings(extra)
	for _, e := range extra {
		t.Errorf("the OpenAPI document has %s, which is no route of the gateway", e)
	}
	if len(registered) < 25 {
		t.Errorf("only %d REST operations found in the route table", len(registered))
	}
}

// wantSchemes are the document's security schemes for each scope a route
// may admit: a federation access token is the inference scope's.
var wantSchemes = map[auth.Scope]string{auth.Public: "", auth.API: "apiKey", auth.Inference: "apiKey federationToken"}

// schemes lists the security schemes an operation accepts, sorted; ""
// for a public one. An operation must say (security: [] when public).
func schemes(op *openapi3.Operation) string {
	if op.Security == nil {
		return "<not declared>"
	}
	var names []string
	for _, req := range *op.Security {
		for name := range req {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// GET /api/v1/openapi.json serves the committed document without a key,
// as the document itself says it does.
func TestOpenAPIDocumentServed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newServer(t, noProvisioner(), deps(t)).Handler())
	t.Cleanup(srv.Close)
	res, body := get(t, request(t, "GET", srv.URL+Prefix+"/openapi.json"))
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" || !bytes.Equal([]byte(body), openapi.Document) {
		t.Fatalf("GET %s/openapi.json: %d %s, %d bytes (want the %d of the document)", Prefix, res.StatusCode, res.Header.Get("Content-Type"), len(body), len(openapi.Document))
	}
	// Through the checking transport: the answer is the document's own
	// operation, and checks out.
	client := &http.Client{Transport: openapitest.Client(t, nil)}
	cres, err := client.Get(srv.URL + Prefix + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	cres.Body.Close()
}
