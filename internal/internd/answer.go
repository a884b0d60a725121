package internd

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"sort"

	acp "github.com/coder/acp-go-sdk"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// Conventions shared with the built-in agent (BRIEFING "Runtime conventions").
const (
	// MetaApprovalMode is sent on every session/prompt: "manual" or "self-drive".
	MetaApprovalMode = "cohort.dev/approval_mode"
	// MetaModel is the upstream model id the agent reports on session/update.
	MetaModel = "cohort.dev/model"
	// MetaCost is the turn's USD cost on PromptResponse._meta.
	MetaCost = "cohort.dev/cost"
	// MetaSessionID names the ACP session of an elicitation/create request:
	// ACP puts sessionId on the request itself, but acp-go-sdk v0.13.0 drops
	// it when it decodes the form variant.
	MetaSessionID = "cohort.dev/session_id"
)

// Permission option kinds (the spec's names are ACP's).
var permissionKinds = []string{"allow_once", "allow_always", "reject_once", "reject_always"}

// Field types a question may carry.
var fieldTypes = []string{"string", "number", "integer", "boolean"}

// parse checks an answer against the interaction. Anything not acceptable
// is bad_request 400 and changes nothing.
func (ia *interaction) parse(text string) (reply, error) {
	if !ia.question {
		if text == "cancel" {
			return reply{cancel: true}, nil
		}
		if id, ok := ia.optionID[text]; ok {
			return reply{optionID: id}, nil
		}
		return reply{}, apierr.BadRequest("the answer must be one of the offered options %v or \"cancel\"", ia.kinds)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var a struct {
		Action  string                     `json:"action"`
		Content map[string]json.RawMessage `json:"content"`
	}
	if err := dec.Decode(&a); err != nil || dec.More() {
		return reply{}, apierr.BadRequest("the answer must be a JSON object {\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {...}}")
	}
	switch a.Action {
	case "decline", "cancel":
		if a.Content != nil {
			return reply{}, apierr.BadRequest("content is only allowed with action accept")
		}
		return reply{decline: a.Action == "decline", cancel: a.Action == "cancel"}, nil
	case "accept":
	default:
		return reply{}, apierr.BadRequest("action must be accept, decline or cancel")
	}
	if a.Content == nil {
		a.Content = map[string]json.RawMessage{}
	}
	out := make(map[string]any, len(a.Content))
	for name := range a.Content {
		if !slices.ContainsFunc(ia.fields, func(f *pb.Field) bool { return f.GetName() == name }) {
			return reply{}, apierr.BadRequest("content has no field %q", name)
		}
	}
	for _, f := range ia.fields {
		raw, ok := a.Content[f.GetName()]
		if !ok || string(raw) == "null" {
			if f.GetRequired() {
				return reply{}, apierr.BadRequest("field %q is required", f.GetName())
			}
			continue
		}
		v, err := checkValue(f, raw)
		if err != nil {
			return reply{}, err
		}
		out[f.GetName()] = v
	}
	return reply{content: out}, nil
}

func checkValue(f *pb.Field, raw json.RawMessage) (any, error) {
	bad := func() (any, error) {
		return nil, apierr.BadRequest("field %q must be a %s", f.GetName(), f.GetType())
	}
	var v any
	switch f.GetType() {
	case "string":
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return bad()
		}
		if len(f.GetOptions()) > 0 && !slices.Contains(f.GetOptions(), s) {
			return nil, apierr.BadRequest("field %q must be one of %v", f.GetName(), f.GetOptions())
		}
		v = s
	case "number", "integer":
		var n float64
		if json.Unmarshal(raw, &n) != nil || math.IsInf(n, 0) {
			return bad()
		}
		if f.GetType() == "integer" {
			if n != math.Trunc(n) {
				return bad()
			}
			v = int64(n)
		} else {
			v = n
		}
	case "boolean":
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return bad()
		}
		v = b
	default:
		return bad()
	}
	return v, nil
}

// fieldsFromSchema turns an elicitation's requested schema into field
// descriptors, sorted by name (a JSON object has no order). Properties of
// a type we cannot carry become strings; enum values (or oneOf consts)
// become the options.
func fieldsFromSchema(s acp.UnstableElicitationSchema) []*pb.Field {
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*pb.Field, 0, len(names))
	for _, n := range names {
		f := &pb.Field{Name: n, Type: "string", Required: slices.Contains(s.Required, n)}
		if p, ok := s.Properties[n].(map[string]any); ok {
			if t, ok := p["type"].(string); ok && slices.Contains(fieldTypes, t) {
				f.Type = t
			}
			if f.Type == "string" {
				f.Options = enumOptions(p)
			}
		}
		out = append(out, f)
	}
	return out
}

func enumOptions(p map[string]any) []string {
	var out []string
	if e, ok := p["enum"].([]any); ok {
		for _, v := range e {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	for _, key := range []string{"oneOf", "anyOf"} {
		if e, ok := p[key].([]any); ok {
			for _, v := range e {
				if m, ok := v.(map[string]any); ok {
					if s, ok := m["const"].(string); ok {
						out = append(out, s)
					}
				}
			}
		}
	}
	return out
}
