package egress

import (
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/cohort-dev/cohort/internal/httptool"
)

// The model relay is narrow: the real key goes only into the auth header
// of a model API, on that API's own calls, and is redacted from every
// response. An agent's request that puts the placeholder anywhere else, or
// calls anything else on the endpoint's host, is refused with 403 and a
// reason, and nothing is substituted (ADR 0017).

// provider is one model API family: the header its key goes in and the
// calls that take it.
type provider struct {
	name string
	// header carries the key; bearer: as "Bearer <key>".
	header string
	bearer bool
	// query is a parameter its SDKs may send the key in instead (Gemini's
	// ?key=): a placeholder there is moved into header, never forwarded in
	// the URL.
	query string
	calls []call
}

// call is one model API call: a method and the path under the endpoint's
// own path.
type call struct {
	method string
	path   *regexp.Regexp
	doc    string
}

func newCall(method, doc, pattern string) call {
	return call{method: method, doc: method + " " + doc, path: regexp.MustCompile(`^` + pattern + `$`)}
}

// A model id: no slash, no leading dot (so never "." or ".."), no
// placeholder-bearing oddities beyond what ids use.
const modelID = `[A-Za-z0-9][A-Za-z0-9._:-]*`

// providers are the model APIs the relay carries. An endpoint's path
// (https://api.openai.com/v1, or a proxy's /openai/v1) is stripped first;
// the OpenAI and Anthropic calls may keep a /v1 of their own (an endpoint
// given without it).
var providers = []*provider{
	{name: "OpenAI", header: "Authorization", bearer: true, calls: []call{
		newCall("POST", "[/v1]/chat/completions", `(/v1)?/chat/completions`),
		newCall("POST", "[/v1]/responses", `(/v1)?/responses`),
		newCall("POST", "[/v1]/completions", `(/v1)?/completions`),
		newCall("POST", "[/v1]/embeddings", `(/v1)?/embeddings`),
		newCall("GET", "[/v1]/models[/{model}]", `(/v1)?/models(/`+modelID+`)?`),
	}},
	{name: "Anthropic", header: "X-Api-Key", calls: []call{
		newCall("POST", "[/v1]/messages", `(/v1)?/messages`),
		newCall("POST", "[/v1]/messages/count_tokens", `(/v1)?/messages/count_tokens`),
		newCall("GET", "[/v1]/models[/{model}]", `(/v1)?/models(/`+modelID+`)?`),
	}},
	{name: "Gemini", header: "X-Goog-Api-Key", query: "key", calls: []call{
		newCall("POST", "/v1beta|/v1/models/{model}:generateContent|streamGenerateContent|countTokens|embedContent|batchEmbedContents",
			`/(v1beta|v1)/models/[A-Za-z0-9][A-Za-z0-9._-]*:(generateContent|streamGenerateContent|countTokens|embedContent|batchEmbedContents)`),
		newCall("GET", "/v1beta|/v1/models[/{model}]", `/(v1beta|v1)/models(/[A-Za-z0-9][A-Za-z0-9._-]*)?`),
	}},
}

func (p *provider) allows(method, rest string) bool {
	for _, c := range p.calls {
		if c.method == method && c.path.MatchString(rest) {
			return true
		}
	}
	return false
}

func (p *provider) doc() string {
	var out []string
	for _, c := range p.calls {
		out = append(out, c.doc)
	}
	return strings.Join(out, ", ")
}

// where says where p takes the key.
func (p *provider) where() string {
	w := p.header + ": " + map[bool]string{true: "Bearer <key>", false: "<key>"}[p.bearer]
	if p.query != "" {
		w += " (or ?" + p.query + "=<key>, moved into the header)"
	}
	return w
}

// refusal is a request the model relay does not carry.
type refusal struct{ code, message string }

// modelPlan is how one checked request goes out: the provider whose
// header takes the key (nil: the request carries no placeholder), and
// whether the key's query parameter is dropped from the URL.
type modelPlan struct {
	p         *provider
	dropQuery bool
}

// checkModel decides whether the model relay carries req to an endpoint
// whose own path is base, and how.
func checkModel(req *http.Request, base, placeholder string) (modelPlan, *refusal) {
	var plan modelPlan
	if req.Header.Get("Upgrade") != "" {
		return plan, &refusal{"upgrade_refused", "the model relay does not switch protocols (a connection it cannot read could carry the key back): use HTTP streaming"}
	}
	p := req.URL.Path
	// Only a path in its plain form: the upstream must see the path that
	// was checked, not another spelling of it (%2F, /./, //).
	if req.URL.RawPath != "" || p == "" || path.Clean(p) != p {
		return plan, &refusal{"path_not_allowed", fmt.Sprintf("the model relay takes plain paths only, not %q", clip(req.URL.EscapedPath()))}
	}
	base = strings.TrimRight(base, "/")
	rest, ok := strings.CutPrefix(p, base)
	if !ok || !strings.HasPrefix(rest, "/") {
		return plan, &refusal{"path_not_allowed", fmt.Sprintf("the model endpoint is under %s/, not %q", base, clip(p))}
	}
	creds := map[*provider]bool{}
	if placeholder != "" {
		var misplaced []string
		if strings.Contains(p, placeholder) {
			misplaced = append(misplaced, "the path")
		}
		for name, vals := range req.Header {
			if strings.Contains(strings.ToLower(name), strings.ToLower(placeholder)) {
				misplaced = append(misplaced, "a header name")
				continue
			}
			for _, v := range vals {
				if !strings.Contains(v, placeholder) {
					continue
				}
				if pr := headerCred(name, vals, placeholder); pr != nil {
					creds[pr] = true
				} else {
					misplaced = append(misplaced, "header "+name)
				}
			}
		}
		if req.URL.RawQuery != "" {
			q, err := url.ParseQuery(req.URL.RawQuery)
			if err != nil && strings.Contains(req.URL.RawQuery, placeholder) {
				misplaced = append(misplaced, "the query")
			}
			for k, vals := range q {
				if strings.Contains(k, placeholder) {
					misplaced = append(misplaced, "the query")
				}
				for _, v := range vals {
					if !strings.Contains(v, placeholder) {
						continue
					}
					if pr := queryCred(k, vals, placeholder); pr != nil {
						creds[pr], plan.dropQuery = true, true
					} else {
						misplaced = append(misplaced, "query parameter "+k)
					}
				}
			}
		}
		if len(misplaced) > 0 {
			return plan, &refusal{"key_misplaced", fmt.Sprintf("the model key placeholder goes only in the provider's auth header (%s); found in %s",
				allWheres(), strings.Join(misplaced, ", "))}
		}
		if len(creds) > 1 {
			return plan, &refusal{"key_misplaced", "the model key placeholder goes in one provider's auth header per request, not several"}
		}
	}
	for pr := range creds {
		plan.p = pr
	}
	if plan.p != nil {
		if !plan.p.allows(req.Method, rest) {
			return plan, &refusal{"path_not_allowed", fmt.Sprintf("the key in %s goes only with %s calls (%s); %s %s is not one",
				plan.p.header, plan.p.name, plan.p.doc(), req.Method, clip(p))}
		}
		return plan, nil
	}
	for _, pr := range providers {
		if pr.allows(req.Method, rest) {
			return plan, nil
		}
	}
	var docs []string
	for _, pr := range providers {
		docs = append(docs, pr.name+": "+pr.doc())
	}
	return plan, &refusal{"path_not_allowed", fmt.Sprintf("the model relay carries model API calls only (%s); %s %s is not one",
		strings.Join(docs, "; "), req.Method, clip(p))}
}

// headerCred is the provider whose auth header name is, when it holds
// exactly the placeholder in that provider's form.
func headerCred(name string, vals []string, placeholder string) *provider {
	for _, pr := range providers {
		if http.CanonicalHeaderKey(name) != pr.header || len(vals) != 1 {
			continue
		}
		v := vals[0]
		if pr.bearer {
			scheme, tok, ok := strings.Cut(v, " ")
			if ok && strings.EqualFold(scheme, "Bearer") && tok == placeholder {
				return pr
			}
		} else if v == placeholder {
			return pr
		}
	}
	return nil
}

// queryCred is the provider whose key parameter k is, holding exactly the
// placeholder.
func queryCred(k string, vals []string, placeholder string) *provider {
	for _, pr := range providers {
		if pr.query != "" && k == pr.query && len(vals) == 1 && vals[0] == placeholder {
			return pr
		}
	}
	return nil
}

func allWheres() string {
	var out []string
	for _, pr := range providers {
		out = append(out, pr.name+" "+pr.where())
	}
	return strings.Join(out, "; ")
}

// clip bounds what of the agent's request a message repeats.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// apply puts key where plan says, on the outgoing request, and asks for an
// uncompressed answer, which the redaction can read as it streams.
func (plan modelPlan) apply(out *http.Request, key string) {
	out.Header.Set("Accept-Encoding", "identity")
	if plan.p == nil || key == "" {
		return
	}
	if plan.p.bearer {
		out.Header.Set(plan.p.header, "Bearer "+key)
	} else {
		out.Header.Set(plan.p.header, key)
	}
	if plan.dropQuery {
		q := out.URL.Query()
		q.Del(plan.p.query)
		out.URL.RawQuery = q.Encode()
	}
}

// modelError answers the agent in the shape its SDKs read: an error
// object with a type, a code and a message.
func modelError(w http.ResponseWriter, status int, typ, code, message string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "code": code, "message": "cohort: " + message}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.Header().Del("Content-Encoding")
	w.WriteHeader(status)
	w.Write(b)
}

// errEncoding is an answer in a content encoding the redaction cannot
// read: it is not passed on.
var errEncoding = errors.New("the model endpoint answered in a content encoding the relay cannot check for the key")

// redactResponse makes res's body, as it streams, free of the key:
// decoded when the upstream compressed it anyway, then redacted.
func redactResponse(res *http.Response, red *httptool.Redactor) error {
	enc, err := contentCoding(res.Header)
	if err != nil {
		return err
	}
	var open func(io.Reader) (io.Reader, error)
	switch enc {
	case "", "identity":
	case "gzip", "x-gzip":
		open = func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }
	case "deflate":
		open = func(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }
	default:
		return errEncoding
	}
	var body io.Reader = res.Body
	if open != nil {
		body = &lazyDecoder{src: res.Body, open: open}
		res.Header.Del("Content-Encoding")
	}
	// A placeholder need not be as long as the key.
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	res.Body = struct {
		io.Reader
		io.Closer
	}{red.Reader(body), res.Body}
	return nil
}

// contentCoding is the one content coding of a response (lower case, ""
// for none). Every Content-Encoding line counts, not only the first: an
// answer with two ("identity" on one line, "gzip" on the next, or
// "identity, gzip") is refused, since a client may decode what the relay
// took for plain.
func contentCoding(h http.Header) (string, error) {
	var codings []string
	for _, line := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(line, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" {
				codings = append(codings, c)
			}
		}
	}
	switch len(codings) {
	case 0:
		return "", nil
	case 1:
		return codings[0], nil
	}
	return "", errEncoding
}

// lazyDecoder opens its decoder at the first read: a decoder reads its
// header at once, which would hold the response's headers back until the
// upstream's first bytes.
type lazyDecoder struct {
	src  io.Reader
	open func(io.Reader) (io.Reader, error)
	r    io.Reader
}

func (d *lazyDecoder) Read(p []byte) (int, error) {
	if d.r == nil {
		r, err := d.open(d.src)
		if err != nil {
			return 0, err
		}
		d.r = r
	}
	return d.r.Read(p)
}

// redactHeader replaces the key in h's values and drops a header whose
// name holds it.
func redactHeader(h http.Header, red *httptool.Redactor) {
	for name, vals := range h {
		if red.Redact(name) != name {
			delete(h, name)
			continue
		}
		for i, v := range vals {
			vals[i] = red.Redact(v)
		}
	}
}

// redactingWriter redacts the key from every header block written through
// it: informational (1xx) responses, which the reverse proxy passes on
// as they come, and the final one. The caller redacts the trailers, which
// the proxy sets in the header map after the body.
type redactingWriter struct {
	http.ResponseWriter
	red   *httptool.Redactor
	wrote bool
}

func (w *redactingWriter) WriteHeader(code int) {
	redactHeader(w.Header(), w.red)
	if code >= 200 {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *redactingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *redactingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *redactingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
