// Package openapi holds the OpenAPI 3.1 document of the gateway's REST
// routes (openapi.json, maintained by hand beside the route table; ADR
// 0901) and serves it at GET /api/v1/openapi.json. The tests of
// internal/server keep it and the route table equal, and openapitest
// checks the suites' responses against it.
package openapi

import (
	_ "embed"
	"net/http"
)

// Document is the OpenAPI document, as committed.
//
//go:embed openapi.json
var Document []byte

// Serve answers with the document. It is public: API tooling and
// gateways read it before they hold a key.
func Serve(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "public, max-age=300")
	w.Write(Document) //nolint:errcheck // the caller left
}
