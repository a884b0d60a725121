package chat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/accesslog"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/rest"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/turn"
)

// REST is the OpenAI-compatible door:
// POST /api/v1/interns/{internId}/chat/completions, JSON in, SSE out. The
// route is declared (internal/server) with Lookup as its credential lookup
// and Service.Admit as its caller check: both run before the handler Lookup
// returns.
type REST struct {
	S *Service
	// Runs starts the background runs; nil refuses a request with
	// "background": true.
	Runs *runs.Manager
	// SSE tunes the stream (keepalive interval, write deadline).
	SSE sse.Options
}

// Lookup resolves the route's credential and reads the intern's row in
// the same query: the turn's only database round trip before the daemon
// is called. It returns the chat route's handler for the request, bound to
// that row (ADR 0971).
func (h REST) Lookup(ctx context.Context, r *http.Request, a *auth.Authenticator) (*auth.Principal, http.Handler, error) {
	p, pl, err := h.S.Interns.Authenticate(ctx, a, r.Header.Get("Authorization"), r.PathValue("internId"))
	if err != nil {
		return nil, nil, err
	}
	return p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.completions(w, r, pl) }), nil
}

// completions handles the chat route for the intern's row pl, read with
// the key. Every refusal before the daemon's first event is the spec's
// JSON error body (with metadata.reason except for 401, the
// departed-creator 403 and the programme 404); after it, the response is
// a 200 event stream.
func (h REST) completions(w http.ResponseWriter, r *http.Request, pl interns.Preloaded) {
	ctx := r.Context()
	p := auth.From(ctx)
	body, err := rest.ReadBody(w, r, turn.MaxBody, apierr.ReasonPayloadTooLarge)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	req, err := DecodeRequest(body)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	req.InternId = r.PathValue("internId")
	load := func() (*store.Intern, error) { return pl.Get(p) }
	if background(ctx, h.Runs, req) {
		h.background(w, r, p, req, load)
		return
	}
	st, err := h.S.Open(ctx, p, req, load, turn.Options{})
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	// Closing after Serve returns is what cancels the run of a caller who
	// hung up; after the final chunk the daemon call is already over.
	defer st.Close()
	if err := sse.Serve(w, r, st, h.SSE); err != nil {
		accesslog.LoggerFrom(ctx).InfoContext(ctx, "chat stream stopped early", "reason", "client_closed_request", "err", err)
	}
}

// background answers a REST request with "background": true: 202 and
// the run object.
func (h REST) background(w http.ResponseWriter, r *http.Request, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, load func() (*store.Intern, error)) {
	if h.Runs == nil {
		rest.WriteError(w, r, errNoBackground, true)
		return
	}
	res, err := h.Runs.Start(r.Context(), p, req, load)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	w.Write(append(res.JSON, '\n'))
}

// DecodeRequest parses the JSON body of the REST door into the typed
// request. Unlike the workspace route, unknown fields are ignored (the spec
// accepts any other OpenAI field); a known field of the wrong type, a
// missing required field and `stream` not true are 400 bad_request naming
// the field.
func DecodeRequest(body []byte) (*cohortv1.StreamChatCompletionRequest, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierr.BadRequest("request body is empty: want a JSON object")
	}
	if err := rest.CheckText(body); err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, apierr.BadRequest("request body must be a JSON object")
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, apierr.BadRequest("malformed JSON at byte %d", se.Offset)
		}
		return nil, apierr.BadRequest("malformed JSON")
	}
	req := &cohortv1.StreamChatCompletionRequest{}

	var stream *bool
	if err := field(top, "stream", "a boolean", &stream); err != nil {
		return nil, err
	}
	if stream == nil || !*stream {
		return nil, apierr.BadRequest("stream must be true: this endpoint only streams")
	}
	var mode *string
	if err := field(top, "approval_mode", "a string", &mode); err != nil {
		return nil, err
	}
	if mode != nil {
		if *mode == "" {
			// An explicit empty string is not the omitted default.
			return nil, apierr.BadRequest("approval_mode must be %q or %q", turn.ModeManual, turn.ModeSelfDrive)
		}
		req.ApprovalMode = *mode
	}
	var background *bool
	if err := field(top, "background", "a boolean", &background); err != nil {
		return nil, err
	}
	req.Background = background != nil && *background
	if err := field(top, "model", "a string", &req.Model); err != nil {
		return nil, err
	}
	if err := field(top, "session_id", "a string", &req.SessionId); err != nil {
		return nil, err
	}

	var msgs []json.RawMessage
	if err := field(top, "messages", "an array", &msgs); err != nil {
		return nil, err
	}
	if msgs == nil {
		return nil, apierr.BadRequest("messages is required")
	}
	for i, raw := range msgs {
		m, err := decodeMessage(i, raw)
		if err != nil {
			return nil, err
		}
		req.Messages = append(req.Messages, m)
	}
	return req, nil
}

// field decodes top[name] into dst (a pointer to a pointer or slice); an
// absent field and a JSON null leave dst unset.
func field(top map[string]json.RawMessage, name, want string, dst any) error {
	raw, ok := top[name]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return apierr.BadRequest("field %q must be %s", name, want)
	}
	return nil
}

// contentRequired are the roles whose content key must be present (it may
// still be null).
var contentRequired = map[string]bool{"system": true, "developer": true, "user": true, "tool": true}

func decodeMessage(i int, raw json.RawMessage) (*cohortv1.ChatMessage, error) {
	name := func(f string) string { return fmt.Sprintf("messages[%d].%s", i, f) }
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, apierr.BadRequest("messages[%d] must be an object", i)
	}
	m := &cohortv1.ChatMessage{}
	var role *string
	if err := field(obj, "role", "a string", &role); err != nil {
		return nil, apierr.BadRequest("field %q must be a string", name("role"))
	}
	if role == nil {
		return nil, apierr.BadRequest("%s is required", name("role"))
	}
	m.Role = *role

	rawContent, has := obj["content"]
	if !has && contentRequired[m.Role] {
		return nil, apierr.BadRequest("%s is required", name("content"))
	}
	if has {
		c, err := decodeContent(name("content"), rawContent)
		if err != nil {
			return nil, err
		}
		m.Content = c
	}
	if m.Role == "tool" {
		var id *string
		if err := field(obj, "tool_call_id", "a string", &id); err != nil {
			return nil, apierr.BadRequest("field %q must be a string", name("tool_call_id"))
		}
		if id == nil {
			return nil, apierr.BadRequest("%s is required", name("tool_call_id"))
		}
		m.ToolCallId = *id
	}
	if m.Role == "assistant" {
		var calls []json.RawMessage
		if err := field(obj, "tool_calls", "an array", &calls); err != nil {
			return nil, apierr.BadRequest("field %q must be an array", name("tool_calls"))
		}
		for j, rc := range calls {
			tc, err := decodeToolCall(fmt.Sprintf("messages[%d].tool_calls[%d]", i, j), rc)
			if err != nil {
				return nil, err
			}
			m.ToolCalls = append(m.ToolCalls, tc)
		}
	}
	return m, nil
}

// decodeContent accepts a string, an array of text parts (joined without a
// separator: the parts are pieces of one message) or null.
func decodeContent(name string, raw json.RawMessage) (*string, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return &s, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, apierr.BadRequest("%s must be a string, an array of text parts or null", name)
	}
	var b strings.Builder
	for j, rp := range parts {
		var part struct {
			Type *string `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(rp, &part); err != nil {
			return nil, apierr.BadRequest("%s[%d] must be an object {\"type\":\"text\",\"text\":string}", name, j)
		}
		if part.Type == nil || *part.Type != "text" {
			return nil, apierr.BadRequest("%s[%d].type must be \"text\"", name, j)
		}
		if part.Text == nil {
			return nil, apierr.BadRequest("%s[%d].text is required", name, j)
		}
		b.WriteString(*part.Text)
	}
	s = b.String()
	return &s, nil
}

func decodeToolCall(name string, raw json.RawMessage) (*cohortv1.ToolCall, error) {
	var tc struct {
		ID       *string `json:"id"`
		Type     *string `json:"type"`
		Function *struct {
			Name      *string `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, apierr.BadRequest("field %q must be %s", name+"."+te.Field, jsonKind(te.Type.Kind().String()))
		}
		return nil, apierr.BadRequest("%s must be an object", name)
	}
	if tc.ID == nil {
		return nil, apierr.BadRequest("%s.id is required", name)
	}
	out := &cohortv1.ToolCall{Id: *tc.ID, Type: "function", Function: &cohortv1.FunctionCall{}}
	if tc.Type != nil {
		out.Type = *tc.Type
	}
	if tc.Function != nil {
		if tc.Function.Name != nil {
			out.Function.Name = *tc.Function.Name
		}
		if tc.Function.Arguments != nil {
			out.Function.Arguments = *tc.Function.Arguments
		}
	}
	return out, nil
}

func jsonKind(k string) string {
	switch k {
	case "string", "ptr":
		return "a string"
	case "struct":
		return "an object"
	default:
		return "of another type"
	}
}

// Models is GET /api/v1/interns/{internId}/models: the OpenAI list of the
// models this base URL serves, which is the intern's one model. Clients
// that list models before they chat (many chat front-ends, the OpenAI
// SDKs' models.list) then work with the intern as their base URL. The
// chat's gates and credentials apply.
func (h REST) Models(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	in, err := h.S.Interns.Load(ctx, auth.From(ctx), r.PathValue("internId"))
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	rest.WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{
		{"id": in.Model, "object": "model", "created": in.CreatedAt.Unix(), "owned_by": "cohort"},
	}})
}
