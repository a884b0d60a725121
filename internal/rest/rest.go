// Package rest holds what every REST door needs: bounded request bodies,
// strict JSON decoding whose errors name the offending field (and text
// that is not Unicode, CheckText), and the JSON and error responses of the
// REST route families.
package rest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cohort-dev/cohort/internal/accesslog"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// ReadBody reads at most limit bytes of r's JSON body. A longer body is a
// 413 with the given reason; a body declared as anything but JSON is a 415
// (JSONType). A gzip body (Content-Encoding: gzip) is
// decompressed, the limit applying to what it decompresses to; any other
// encoding is a 415, never read as if it were plain.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64, reason apierr.Reason) (_ []byte, err error) {
	if err := JSONType(r.Header.Get("Content-Type")); err != nil {
		Drain(w, r.Body)
		return nil, err
	}
	tooLarge := apierr.New(http.StatusRequestEntityTooLarge, reason, "request body exceeds %d bytes", limit)
	orig := r.Body
	defer func() {
		if err != nil && errors.Is(err, tooLarge) {
			Drain(w, orig)
		}
	}()
	var src io.Reader = http.MaxBytesReader(w, r.Body, limit)
	gz := false
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				return nil, tooLarge
			}
			return nil, apierr.BadRequest("the gzip request body does not decompress")
		}
		defer zr.Close()
		src, gz = io.LimitReader(zr, limit+1), true
	default:
		return nil, apierr.New(http.StatusUnsupportedMediaType, apierr.ReasonBadRequest, "Content-Encoding %q is not supported: send the body as is, or gzip", enc)
	}
	body, err := io.ReadAll(src)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, tooLarge
		}
		if gz {
			return nil, apierr.BadRequest("the gzip request body does not decompress")
		}
		return nil, apierr.BadRequest("could not read request body")
	}
	if int64(len(body)) > limit {
		return nil, tooLarge
	}
	return body, nil
}

// JSONType accepts the Content-Type of a JSON body: application/json or
// any type/subtype+json, with any parameters, or none at all (a client
// that says nothing is read as JSON). text/plain, forms and the rest are
// a 415 that says what to send.
func JSONType(ct string) error {
	if strings.TrimSpace(ct) == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return apierr.New(http.StatusUnsupportedMediaType, apierr.ReasonBadRequest,
		"Content-Type %q is not JSON: send Content-Type: application/json (with curl: -H 'Content-Type: application/json')", ct)
}

// drainLimit bounds what is read and dropped of a refused body.
const drainLimit = 32 << 20

// Drain reads and drops the rest of a body refused as too large (up to
// drainLimit, for at most 30 s), so that a client that sends its whole
// body before reading gets the JSON 413 instead of a reset connection.
func Drain(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(30 * time.Second))
	io.CopyN(io.Discard, body, drainLimit)
}

// DecodeStrict decodes a JSON object into dst (a pointer to a struct). It
// refuses unknown fields, fields spelled in another case (encoding/json would
// match them silently), duplicate fields, wrong types and trailing data; each
// error names the field.
func DecodeStrict(body []byte, dst any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return apierr.BadRequest("request body is empty: want a JSON object")
	}
	if err := CheckText(body); err != nil {
		return err
	}
	known := jsonFields(reflect.TypeOf(dst).Elem())
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return apierr.BadRequest("request body must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		name := tok.(string)
		if !known[name] {
			return apierr.BadRequest("unknown field %q", name)
		}
		if seen[name] {
			return apierr.BadRequest("duplicate field %q", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return syntaxError(err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return syntaxError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return apierr.BadRequest("malformed JSON: unexpected data after the object")
	}
	if err := json.Unmarshal(body, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field
			if field == "" {
				field = "body"
			}
			return apierr.BadRequest("field %q must be %s, not %s", field, jsonType(te.Type), te.Value)
		}
		return syntaxError(err)
	}
	return nil
}

func syntaxError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return apierr.BadRequest("malformed JSON at byte %d", se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return apierr.BadRequest("malformed JSON: unexpected end of input")
	}
	return apierr.BadRequest("malformed JSON")
}

func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

var fieldCache sync.Map // reflect.Type → map[string]bool

func jsonFields(t reflect.Type) map[string]bool {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = true
	}
	fieldCache.Store(t, m)
	return m
}

// WriteJSON writes v as JSON with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":500,"message":"internal error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// ErrorBody is the common REST error body: {"error":{"code","message"}},
// with metadata.reason where the route family carries one.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is the inside of ErrorBody.
type ErrorObject struct {
	Code     int            `json:"code"`
	Message  string         `json:"message"`
	Metadata *ErrorMetadata `json:"metadata,omitempty"`
}

// ErrorMetadata carries the spec's reason.
type ErrorMetadata struct {
	Reason string `json:"reason"`
}

// WriteError writes err as {"error":{"code","message"}}; when withReason is
// set, a reason is added as metadata.reason (the chat and vault families).
func WriteError(w http.ResponseWriter, r *http.Request, err error, withReason bool) {
	e := apierr.From(err)
	if e.Status >= 500 {
		accesslog.LogFault(r, e)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	body := ErrorBody{Error: ErrorObject{Code: e.Status, Message: e.Message}}
	if withReason && e.Reason != "" && e.Status != http.StatusInternalServerError {
		body.Error.Metadata = &ErrorMetadata{Reason: string(e.Reason)}
	}
	WriteJSON(w, e.Status, body)
}
