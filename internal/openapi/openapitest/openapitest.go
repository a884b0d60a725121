// Package openapitest checks HTTP responses of the gateway against its
// OpenAPI document (internal/openapi), for the test suites: Transport
// wraps a client's RoundTripper and reports every REST response whose
// status, content type or JSON body the document does not allow, and
// every answer from a route the document does not have (ADR 0901).
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	pathpkg "path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/cohort-dev/cohort/internal/openapi"
)

// notREST are the path prefixes on the gateway's port that are not its
// REST API, and so not in the document: the Connect door (its .proto
// files describe it) and, with the Kubernetes provisioner, the intern
// Pods' model relay (kubepods.RelayPath), which relays a model
// provider's own API.
var notREST = []string{"/api/v1/cohort.", "/intern-relay/"}

// A Checker holds a parsed document and its path templates, compiled once.
type Checker struct {
	doc       *openapi3.T
	templates []template
	checked   atomic.Int64

	mu       sync.Mutex // guards compiler and schemas
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema // by JSON Pointer
}

// documentURL names the document for the JSON Schema compiler; nothing
// is fetched from it.
const documentURL = "https://cohort.invalid/openapi.json"

// A template is one path of the document, split into segments; a
// segment "{name}" matches any one non-empty segment.
type template struct {
	path     string
	segments []string
	item     *openapi3.PathItem
}

var (
	defaultOnce    sync.Once
	defaultChecker *Checker
	defaultErr     error
)

// Default is the checker of the committed document, loaded and
// validated once per test binary.
func Default() (*Checker, error) {
	defaultOnce.Do(func() { defaultChecker, defaultErr = New(openapi.Document) })
	return defaultChecker, defaultErr
}

// New parses and validates an OpenAPI document.
func New(document []byte) (*Checker, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("openapitest: the document does not parse: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapitest: the document is not valid OpenAPI: %w", err)
	}
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(document))
	if err != nil {
		return nil, fmt.Errorf("openapitest: the document is not JSON: %w", err)
	}
	c := &Checker{doc: doc, compiler: jsonschema.NewCompiler(), schemas: map[string]*jsonschema.Schema{}}
	c.compiler.DefaultDraft(jsonschema.Draft2020)
	if err := c.compiler.AddResource(documentURL, raw); err != nil {
		return nil, fmt.Errorf("openapitest: %w", err)
	}
	for path, item := range doc.Paths.Map() {
		c.templates = append(c.templates, template{path: path, segments: strings.Split(path, "/"), item: item})
	}
	return c, nil
}

// Checked is how many answers Check has held to an operation of the
// document.
func (c *Checker) Checked() int64 { return c.checked.Load() }

// Doc is the parsed document.
func (c *Checker) Doc() *openapi3.T { return c.doc }

// match finds the document's path for an escaped request path, with its
// parameters. A literal segment wins over a parameter, as in the
// gateway's ServeMux.
func (c *Checker) match(escaped string) (*template, map[string]string) {
	segs := strings.Split(escaped, "/")
	var best *template
	bestLiterals := -1
	for i := range c.templates {
		t := &c.templates[i]
		if len(t.segments) != len(segs) {
			continue
		}
		literals, ok := 0, true
		for j, s := range t.segments {
			if isParam(s) {
				if segs[j] == "" {
					ok = false
					break
				}
				continue
			}
			if s != segs[j] {
				ok = false
				break
			}
			literals++
		}
		if ok && literals > bestLiterals {
			best, bestLiterals = t, literals
		}
	}
	if best == nil {
		return nil, nil
	}
	params := map[string]string{}
	for j, s := range best.segments {
		if isParam(s) {
			params[s[1:len(s)-1]] = segs[j]
		}
	}
	return best, params
}

func isParam(s string) bool { return len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' }

// Operation reports whether the document has an operation for method and
// path (a ServeMux-style path with {name} wildcards, as the route table
// writes them).
func (c *Checker) Operation(method, path string) bool {
	for _, t := range c.templates {
		if t.path == path {
			return t.item.GetOperation(method) != nil
		}
	}
	return false
}

// Check checks res, the answer to req, against the document. It reads a
// non-streaming body whole and gives res a fresh reader over it; a
// text/event-stream body is left unread (its status and content type are
// checked). Requests outside the REST doors (notREST, CORS preflights)
// are not checked.
func (c *Checker) Check(req *http.Request, res *http.Response) error {
	path := req.URL.EscapedPath()
	if req.Method == http.MethodOptions {
		return nil
	}
	for _, p := range notREST {
		if strings.HasPrefix(path, p) {
			return nil
		}
	}
	method := req.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	switch res.StatusCode {
	case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		if cleaned := pathpkg.Clean(path); cleaned != path && cleaned+"/" != path {
			return nil // the mux cleaning the path, before any route
		}
	}
	t, params := c.match(path)
	var op *openapi3.Operation
	if t != nil {
		op = t.item.GetOperation(method)
	}
	if op == nil {
		// The gateway refuses a path or method it has no route for: 404
		// or 405, or before that its gates' 401, 403, 413 or 415 (the
		// vault's subtree); a path it cleans is redirected. An answer
		// that is no refusal came from a route the document lacks.
		if res.StatusCode >= 400 && res.StatusCode < 500 {
			return nil
		}
		switch res.StatusCode {
		case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			return nil
		}
		return fmt.Errorf("%s %s answered %d, but the OpenAPI document has no operation %s for this path: a route missing from the document",
			req.Method, trim(path), res.StatusCode, method)
	}
	c.checked.Add(1)
	desc := fmt.Sprintf("%s %s (%s %s) answered %d %s", req.Method, trim(path), method, t.path, res.StatusCode, res.Header.Get("Content-Type"))
	resp := op.Responses.Status(res.StatusCode)
	if resp == nil && res.StatusCode >= 400 {
		// default is for refusals: a success must be declared by status.
		resp = op.Responses.Default()
	}
	if resp == nil || resp.Value == nil {
		return fmt.Errorf("%s: the document declares no response %d for this operation", desc, res.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt == "text/event-stream" || req.Method == http.MethodHead {
		if mt == "text/event-stream" && resp.Value.Content.Get("text/event-stream") == nil {
			return fmt.Errorf("%s: the document declares no event stream for this status", desc)
		}
		return nil
	}
	body, readErr := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{readErr}))
	if readErr != nil {
		// The connection broke: the caller sees that, not a mismatch.
		return nil
	}
	// kin-openapi checks the status and the declared headers; the body is
	// checked below with the response's schema compiled once (kin-openapi
	// compiles a 3.1 schema anew for each body it validates, which would
	// double the hostile suite's time).
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      &routers.Route{Spec: c.doc, Path: t.path, PathItem: t.item, Method: method, Operation: op},
		},
		Status:  res.StatusCode,
		Header:  res.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("%s: %v", desc, shorten(err))
	}
	content := resp.Value.Content
	if len(content) == 0 {
		if len(body) > 0 {
			return fmt.Errorf("%s: the document declares no body for this status, got %q", desc, trim(string(body)))
		}
		return nil
	}
	media := content.Get(res.Header.Get("Content-Type"))
	if media == nil {
		return fmt.Errorf("%s: the document declares no such content type for this status", desc)
	}
	key := ""
	for k, m := range content {
		if m == media {
			key = k
		}
	}
	if mt, _, _ := mime.ParseMediaType(key); mt != "application/json" {
		return nil // text/plain: any text
	}
	ptr := "/paths/" + escape(t.path) + "/" + strings.ToLower(method) + "/responses/" + statusKey(op.Responses, res.StatusCode)
	if resp.Ref != "" {
		ptr = strings.TrimPrefix(resp.Ref, "#")
	}
	schema, err := c.schema(ptr + "/content/" + escape(key) + "/schema")
	if err != nil {
		return fmt.Errorf("%s: %v", desc, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: the body is not JSON (%v): %q", desc, err, trim(string(body)))
	}
	if err := schema.Validate(v); err != nil {
		return fmt.Errorf("%s: the body does not match the document: %v; body %s", desc, err, trim(string(body)))
	}
	return nil
}

// statusKey is the key of op's responses that answers status.
func statusKey(rs *openapi3.Responses, status int) string {
	st := strconv.Itoa(status)
	if rs.Value(st) != nil {
		return st
	}
	if rs.Value(st[:1]+"XX") != nil {
		return st[:1] + "XX"
	}
	return "default"
}

// escape writes s as one JSON Pointer token (RFC 6901) inside a URI
// fragment.
func escape(s string) string {
	s = strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
	return (&url.URL{Fragment: s}).EscapedFragment()
}

// schema compiles the schema at ptr, a JSON Pointer into the document,
// once.
func (c *Checker) schema(ptr string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[ptr]; ok {
		return s, nil
	}
	s, err := c.compiler.Compile(documentURL + "#" + ptr)
	if err != nil {
		return nil, fmt.Errorf("the document's schema at %s does not compile: %w", ptr, err)
	}
	c.schemas[ptr] = s
	return s, nil
}

// errReader ends a replayed body with the error the read met (nil: EOF).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// shorten keeps a validation error to its reason: kin-openapi appends
// the whole schema.
func shorten(err error) string {
	var re *openapi3filter.ResponseError
	if errors.As(err, &re) {
		msg := re.Reason
		var se *openapi3.SchemaError
		if errors.As(re.Err, &se) {
			msg += ": " + se.Error()
			if i := strings.Index(msg, "\nSchema:"); i >= 0 {
				msg = msg[:i]
			}
		} else if re.Err != nil {
			msg += ": " + re.Err.Error()
		}
		return msg
	}
	s := err.Error()
	if i := strings.Index(s, "\nSchema:"); i >= 0 {
		s = s[:i]
	}
	return s
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// Transport checks every response it carries with Checker. For decides
// per request: it returns where a mismatch is reported (for example a
// test's Errorf), or nil for a request that is not the gateway's.
type Transport struct {
	Base    http.RoundTripper
	Checker *Checker
	For     func(*http.Request) func(msg string)
}

// RoundTrip sends req with Base and checks the response.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.Base.RoundTrip(req)
	if err != nil {
		return res, err
	}
	if report := t.For(req); report != nil {
		if err := t.Checker.Check(req, res); err != nil {
			report("OpenAPI: " + err.Error())
		}
	}
	return res, nil
}

// Client wraps base (nil: http.DefaultTransport) so that every response
// is checked against the committed document, a mismatch failing t.
func Client(t interface {
	Helper()
	Errorf(string, ...any)
	Fatal(...any)
}, base http.RoundTripper) http.RoundTripper {
	t.Helper()
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{Base: base, Checker: c, For: func(*http.Request) func(string) {
		return func(msg string) { t.Errorf("%s", msg) }
	}}
}
