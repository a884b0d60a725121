package builtinagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/builtinagent/sandbox"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Tool names offered to the model.
const (
	ToolShell   = "shell"
	ToolAskUser = "ask_user"
)

// Limits on what the model may ask for.
const (
	maxCommandBytes  = 16 << 10
	maxQuestionBytes = 4 << 10
	maxFields        = 16
)

// Permission option ids (equal to their kinds, so a client that keeps kinds
// and one that keeps ids agree).
const (
	OptionAllowOnce    = "allow_once"
	OptionAllowAlways  = "allow_always"
	OptionRejectOnce   = "reject_once"
	OptionRejectAlways = "reject_always"
)

const systemPrompt = `You are an intern: an autonomous assistant hosted by Cohort.
Use the shell tool to run commands in your work directory when it helps; the user may have to approve each command, and commands may run in a sandbox without network access and with a read-only file system outside the work directory.
Use the ask_user tool when you need information only the user has. Keep answers short.`

var tools = []ToolSpec{
	{
		Name:        ToolShell,
		Description: "Run a shell command (sh -c) in the work directory and return its exit status and combined output. The user may have to approve it first.",
		Parameters: map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"command": map[string]any{"type": "string", "description": "The shell command."}},
			"required":             []string{"command"},
			"additionalProperties": false,
		},
	},
	{
		Name:        ToolAskUser,
		Description: "Ask the user a question and wait for the answer. Returns {\"action\":\"accept\",\"content\":{field: value}}, {\"action\":\"decline\"} or {\"action\":\"cancel\"}.",
		Parameters: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"message": map[string]any{"type": "string", "description": "The question."},
				"fields": map[string]any{
					"type":        "array",
					"description": "The answer's fields; one string field named answer when omitted.",
					"items": map[string]any{
						"type": "object",
						"properties": map[string]any{
							"name":     map[string]any{"type": "string"},
							"type":     map[string]any{"type": "string", "enum": []string{"string", "number", "integer", "boolean"}},
							"required": map[string]any{"type": "boolean"},
							"options":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
						},
						"required": []string{"name", "type"},
					},
				},
			},
			"required": []string{"message"},
		},
	},
}

// usageSum adds up a turn's model calls.
type usageSum struct {
	any                       bool
	prompt, completion, total int64
	cached                    int64
	anyCached                 bool
	cost                      float64
	anyCost                   bool
}

func (u *usageSum) add(c *CallUsage) {
	if c == nil {
		return
	}
	u.any = true
	u.prompt += c.PromptTokens
	u.completion += c.CompletionTokens
	u.total += c.TotalTokens
	if c.CachedTokens != nil {
		u.anyCached = true
		u.cached += *c.CachedTokens
	}
	if c.Cost != nil {
		u.anyCost = true
		u.cost += *c.Cost
	}
}

// turn is one prompt's run.
type turn struct {
	a    *Agent
	s    *session
	mode string
	// model is the id the upstream last reported, for `_meta`.
	model string
	usage usageSum
	// text encodes the turn's text chunks (wire.go).
	text textUpdates
}

// Prompt implements acp.Agent: it runs the model loop until the model answers
// without tool calls, the turn is cancelled, or a model call fails (an ACP
// error response whose data carries the reason).
func (a *Agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	s, err := a.session(p.SessionId)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	// The daemon's trace, from _meta (traceparent): the turn is a span of it.
	ctx, span := telemetry.Tracer().Start(telemetry.Extract(ctx, p.Meta), "agent prompt")
	defer span.End()
	s.mu.Lock()
	def := s.mode
	s.mu.Unlock()
	mode, err := approvalMode(p.Meta, def)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	text := promptText(p.Prompt)
	if strings.TrimSpace(text) == "" {
		return acp.PromptResponse{}, acp.NewInvalidParams(map[string]any{"error": "the prompt has no text"})
	}
	// One turn at a time per session; the connection has already cancelled a
	// previous prompt of this session, so this wait is short.
	s.turn.Lock()
	defer s.turn.Unlock()

	t := &turn{a: a, s: s, mode: mode, model: s.currentModel(), text: textUpdates{session: s.id}}
	s.mu.Lock()
	s.history = append(s.history, Message{Role: "user", Content: text})
	s.used = time.Now()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.used = time.Now()
		s.mu.Unlock()
	}()
	start := time.Now()
	stop, err := t.run(ctx)
	t.closeOpenCalls()
	if serr := a.save(s); serr != nil {
		a.cfg.Logger.Warn("agent: persist session", "session", s.id, "err", serr)
	}
	log := a.cfg.Logger.With("session", s.id, "mode", mode, "model", t.model, "duration", time.Since(start),
		"prompt_tokens", t.usage.prompt, "completion_tokens", t.usage.completion)
	if err != nil {
		log.Warn("agent: turn failed", "err", err)
		var ue *UpstreamError
		if errors.As(err, &ue) {
			return acp.PromptResponse{}, &acp.RequestError{Code: -32603, Message: ue.Message, Data: map[string]any{"reason": ue.Reason}}
		}
		return acp.PromptResponse{}, &acp.RequestError{Code: -32603, Message: "turn failed: " + err.Error(), Data: map[string]any{"reason": "turn_failed"}}
	}
	log.Info("agent: turn ended", "stop", stop)
	resp := acp.PromptResponse{StopReason: stop, Meta: map[string]any{MetaModel: t.model}}
	if t.usage.any {
		resp.Usage = &acp.Usage{InputTokens: int(t.usage.prompt), OutputTokens: int(t.usage.completion), TotalTokens: int(t.usage.total)}
		if t.usage.anyCached {
			resp.Usage.CachedReadTokens = acp.Ptr(int(t.usage.cached))
		}
	}
	if t.usage.anyCost {
		resp.Meta[MetaCost] = t.usage.cost
	}
	return resp, nil
}

// promptText joins the prompt's text blocks; resource links become their URI
// (the baseline every ACP agent accepts).
func promptText(blocks []acp.ContentBlock) string {
	var b strings.Builder
	for _, c := range blocks {
		switch {
		case c.Text != nil:
			b.WriteString(c.Text.Text)
		case c.ResourceLink != nil:
			fmt.Fprintf(&b, "\n[resource %s: %s]\n", c.ResourceLink.Name, c.ResourceLink.Uri)
		}
	}
	return b.String()
}

func (t *turn) run(ctx context.Context) (acp.StopReason, error) {
	for step := 0; step < t.a.cfg.MaxSteps; step++ {
		if ctx.Err() != nil {
			return acp.StopReasonCancelled, nil
		}
		t.s.mu.Lock()
		offered := tools
		for _, m := range t.s.mcp {
			offered = append(offered[:len(offered):len(offered)], m.spec)
		}
		req := ModelRequest{Model: t.s.model, Tools: offered, Messages: append([]Message{{Role: "system", Content: systemPrompt}}, t.s.history...)}
		t.s.mu.Unlock()
		resp, err := t.a.model(req.Model).Complete(ctx, req, t.emit)
		t.usage.add(resp.Usage)
		if resp.Model != "" {
			t.model = resp.Model
		}
		if err != nil {
			if ctx.Err() != nil {
				// Keep what the user already saw, so the next turn knows it.
				t.appendAssistant(resp.Text, nil)
				return acp.StopReasonCancelled, nil
			}
			return "", err
		}
		t.appendAssistant(resp.Text, resp.ToolCalls)
		if len(resp.ToolCalls) == 0 {
			return acp.StopReasonEndTurn, nil
		}
		for _, call := range resp.ToolCalls {
			result, err := t.tool(ctx, call)
			if errors.Is(err, errCancelled) || ctx.Err() != nil {
				return acp.StopReasonCancelled, nil
			}
			if err != nil {
				return "", err
			}
			t.s.mu.Lock()
			t.s.history = append(t.s.history, Message{Role: "tool", ToolCallID: call.ID, Content: result})
			t.s.mu.Unlock()
		}
	}
	return acp.StopReasonMaxTurnRequests, nil
}

func (t *turn) appendAssistant(text string, calls []ToolCall) {
	if text == "" && len(calls) == 0 {
		return
	}
	t.s.mu.Lock()
	t.s.history = append(t.s.history, Message{Role: "assistant", Content: text, ToolCalls: calls})
	t.s.mu.Unlock()
}

// closeOpenCalls answers tool calls a cancelled turn left unanswered: the
// chat-completions API refuses a conversation where a tool call has no
// result, and the next turn must still work.
func (t *turn) closeOpenCalls() {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	answered := map[string]bool{}
	for _, m := range t.s.history {
		if m.Role == "tool" {
			answered[m.ToolCallID] = true
		}
	}
	for _, m := range t.s.history {
		for _, c := range m.ToolCalls {
			if !answered[c.ID] {
				t.s.history = append(t.s.history, Message{Role: "tool", ToolCallID: c.ID, Content: `{"error":"the turn was cancelled before this tool ran"}`})
				answered[c.ID] = true
			}
		}
	}
}

// emit streams a model delta to the client.
func (t *turn) emit(d Delta) error {
	if d.Model != "" {
		t.model = d.Model
	}
	if d.Reasoning != "" {
		if err := t.chunk(d.Reasoning, true); err != nil {
			return err
		}
	}
	if d.Text != "" {
		return t.chunk(d.Text, false)
	}
	return nil
}

// chunk sends an agent_message_chunk (or with thought an
// agent_thought_chunk) of text: encoded here when the agent owns its
// output, else by the SDK. The bytes are the same.
func (t *turn) chunk(text string, thought bool) error {
	out := t.a.out
	if out == nil {
		if thought {
			return t.update(acp.UpdateAgentThoughtText(text))
		}
		return t.update(acp.UpdateAgentMessageText(text))
	}
	if _, err := out.Write(t.text.line(t.model, text, thought)); err != nil {
		// As the SDK reports a failed write.
		return acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	return nil
}

// update sends one session/update carrying the model id.
func (t *turn) update(u acp.SessionUpdate) error {
	// Not the turn's context: a cancelled turn still reports its last tool
	// call status, and the connection's own lifetime bounds the write.
	return t.a.client().SessionUpdate(context.Background(), acp.SessionNotification{
		SessionId: t.s.id, Update: u, Meta: map[string]any{MetaModel: t.model},
	})
}

// tool runs one tool call and returns what the model is told. errCancelled
// ends the turn.
func (t *turn) tool(ctx context.Context, call ToolCall) (string, error) {
	switch call.Name {
	case ToolShell:
		return t.shell(ctx, call)
	case ToolAskUser:
		return t.askUser(ctx, call)
	}
	t.s.mu.Lock()
	remote := t.s.mcp
	t.s.mu.Unlock()
	for _, m := range remote {
		if m.spec.Name == call.Name {
			return t.mcpCall(ctx, m, call)
		}
	}
	_ = t.update(acp.StartToolCall(acp.ToolCallId(call.ID), call.Name, acp.WithStartKind(acp.ToolKindOther), acp.WithStartStatus(acp.ToolCallStatusFailed)))
	return toolError(fmt.Sprintf("unknown tool %q; the tools are %s and %s", call.Name, ToolShell, ToolAskUser)), nil
}

func toolError(msg string) string { return toolJSON(map[string]string{"error": msg}) }

// toolJSON encodes a tool result for the model, without HTML escaping (the
// model reads "<", not "\u003c").
func toolJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// decodeArgs decodes a tool call's arguments strictly, so a model that
// misspells a key learns about it.
func decodeArgs(raw string, v any) error {
	if strings.TrimSpace(raw) == "" {
		raw = "{}"
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func (t *turn) failCall(id, msg string) string {
	_ = t.update(acp.UpdateToolCall(acp.ToolCallId(id), acp.WithUpdateStatus(acp.ToolCallStatusFailed),
		acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(msg))})))
	return toolError(msg)
}

func (t *turn) shell(ctx context.Context, call ToolCall) (string, error) {
	id := acp.ToolCallId(call.ID)
	var args struct {
		Command string `json:"command"`
	}
	err := decodeArgs(call.Arguments, &args)
	_ = t.update(acp.StartToolCall(id, ToolShell, acp.WithStartKind(acp.ToolKindExecute), acp.WithStartStatus(acp.ToolCallStatusPending),
		acp.WithStartRawInput(map[string]any{"command": args.Command})))
	switch {
	case err != nil:
		return t.failCall(call.ID, fmt.Sprintf(`invalid arguments for %s (%v); expected {"command": "<shell command>"}`, ToolShell, err)), nil
	case strings.TrimSpace(args.Command) == "":
		return t.failCall(call.ID, `invalid arguments for shell: "command" is empty; expected {"command": "<shell command>"}`), nil
	case len(args.Command) > maxCommandBytes:
		return t.failCall(call.ID, fmt.Sprintf("invalid arguments for shell: the command is longer than %d bytes", maxCommandBytes)), nil
	}

	confined := false
	if t.mode == ModeManual {
		t.s.mu.Lock()
		escalated, refused := t.s.escalated, t.s.refused
		t.s.mu.Unlock()
		switch {
		case refused:
			return t.failCall(call.ID, "the user refused shell commands for the rest of this session"), nil
		case escalated:
			// An earlier allow_always lifted the sandbox and the asking.
		default:
			choice, err := t.askPermission(ctx, id, args.Command)
			if err != nil {
				return "", err
			}
			switch choice {
			case OptionAllowOnce:
				confined = true
			case OptionAllowAlways:
				t.s.mu.Lock()
				t.s.escalated = true
				t.s.mu.Unlock()
			case OptionRejectAlways:
				t.s.mu.Lock()
				t.s.refused = true
				t.s.mu.Unlock()
				return t.failCall(call.ID, "the user rejected this command and any further shell command in this session"), nil
			default:
				return t.failCall(call.ID, "the user rejected this command"), nil
			}
		}
	}
	_ = t.update(acp.UpdateToolCall(id, acp.WithUpdateStatus(acp.ToolCallStatusInProgress)))
	t.s.mu.Lock()
	dir := t.s.cwd
	t.s.mu.Unlock()
	res, err := sandbox.Run(ctx, sandbox.Spec{
		Command: args.Command, Dir: dir, Confined: confined,
		Timeout: t.a.cfg.ShellTimeout, MaxOutput: t.a.cfg.MaxToolOutput,
	})
	if ctx.Err() != nil {
		return "", errCancelled
	}
	if err != nil {
		return t.failCall(call.ID, err.Error()), nil
	}
	out := map[string]any{"exit_code": res.ExitCode, "output": res.Output, "sandboxed": res.Confined}
	if res.Truncated {
		out["output_truncated"] = fmt.Sprintf("only the first %d of %d bytes are shown", len(res.Output), res.TotalBytes)
	}
	if res.TimedOut {
		out["timed_out"] = fmt.Sprintf("the command was killed after %s", res.Duration.Round(time.Millisecond))
	} else if why := limitHint(res.ExitCode); why != "" {
		out["limit"] = why
	}
	status := acp.ToolCallStatusCompleted
	if res.ExitCode != 0 || res.TimedOut {
		status = acp.ToolCallStatusFailed
	}
	_ = t.update(acp.UpdateToolCall(id, acp.WithUpdateStatus(status),
		acp.WithUpdateRawOutput(out),
		acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(res.Output))})))
	return toolJSON(out), nil
}

// askPermission asks the client whether the command may run and returns the
// chosen option id. A cancelled outcome, or the turn's cancellation during
// the wait, is errCancelled.
func (t *turn) askPermission(ctx context.Context, id acp.ToolCallId, command string) (string, error) {
	resp, err := t.a.client().RequestPermission(ctx, acp.RequestPermissionRequest{
		SessionId: t.s.id,
		Meta:      map[string]any{MetaModel: t.model, MetaTool: ToolShell},
		ToolCall: acp.ToolCallUpdate{
			ToolCallId: id,
			Title:      acp.Ptr(ToolShell),
			Kind:       acp.Ptr(acp.ToolKindExecute),
			Status:     acp.Ptr(acp.ToolCallStatusPending),
			RawInput:   map[string]any{"command": command},
			Content:    []acp.ToolCallContent{acp.ToolContent(acp.TextBlock("$ " + command))},
		},
		Options: []acp.PermissionOption{
			{OptionId: OptionAllowOnce, Kind: acp.PermissionOptionKindAllowOnce, Name: "Allow once, in the sandbox (read-only system, writable work directory, no network)"},
			{OptionId: OptionAllowAlways, Kind: acp.PermissionOptionKindAllowAlways, Name: "Always allow in this session, without the sandbox"},
			{OptionId: OptionRejectOnce, Kind: acp.PermissionOptionKindRejectOnce, Name: "Reject"},
			{OptionId: OptionRejectAlways, Kind: acp.PermissionOptionKindRejectAlways, Name: "Reject all shell commands in this session"},
		},
	})
	if ctx.Err() != nil {
		return "", errCancelled
	}
	if err != nil {
		return "", fmt.Errorf("permission request failed: %w", err)
	}
	if resp.Outcome.Selected == nil {
		return "", errCancelled
	}
	return string(resp.Outcome.Selected.OptionId), nil
}

// Field is one field of an ask_user question.
type Field struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Required bool     `json:"required,omitempty"`
	Options  []string `json:"options,omitempty"`
}

var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,63}$`)

func validateQuestion(message string, fields []Field) error {
	if strings.TrimSpace(message) == "" {
		return errors.New(`"message" is empty`)
	}
	if len(message) > maxQuestionBytes {
		return fmt.Errorf(`"message" is longer than %d bytes`, maxQuestionBytes)
	}
	if len(fields) > maxFields {
		return fmt.Errorf("at most %d fields", maxFields)
	}
	seen := map[string]bool{}
	for _, f := range fields {
		if !fieldName.MatchString(f.Name) {
			return fmt.Errorf("field name %q must match %s", f.Name, fieldName)
		}
		if seen[f.Name] {
			return fmt.Errorf("field %q appears twice", f.Name)
		}
		seen[f.Name] = true
		switch f.Type {
		case "string", "number", "integer", "boolean":
		default:
			return fmt.Errorf("field %q: type must be string, number, integer or boolean", f.Name)
		}
		if len(f.Options) > 0 && f.Type != "string" {
			return fmt.Errorf("field %q: options are for string fields", f.Name)
		}
	}
	return nil
}

func (t *turn) askUser(ctx context.Context, call ToolCall) (string, error) {
	id := acp.ToolCallId(call.ID)
	var args struct {
		Message string   `json:"message"`
		Fields  *[]Field `json:"fields"`
	}
	err := decodeArgs(call.Arguments, &args)
	_ = t.update(acp.StartToolCall(id, ToolAskUser, acp.WithStartKind(acp.ToolKindOther), acp.WithStartStatus(acp.ToolCallStatusPending),
		acp.WithStartRawInput(map[string]any{"message": args.Message})))
	if err != nil {
		return t.failCall(call.ID, fmt.Sprintf(`invalid arguments for %s (%v); expected {"message": "<question>", "fields": [{"name": "answer", "type": "string", "required": true}]}`, ToolAskUser, err)), nil
	}
	fields := []Field{{Name: "answer", Type: "string", Required: true}}
	if args.Fields != nil && len(*args.Fields) > 0 {
		fields = *args.Fields
	}
	if err := validateQuestion(args.Message, fields); err != nil {
		return t.failCall(call.ID, "invalid arguments for ask_user: "+err.Error()), nil
	}
	props := map[string]any{}
	var required []string
	for _, f := range fields {
		p := map[string]any{"type": f.Type, "title": f.Name}
		if len(f.Options) > 0 {
			p["enum"] = f.Options
		}
		props[f.Name] = p
		if f.Required {
			required = append(required, f.Name)
		}
	}
	resp, err := t.a.client().UnstableCreateElicitation(ctx, acp.UnstableCreateElicitationRequest{Form: &acp.UnstableCreateElicitationForm{
		Message: args.Message,
		Mode:    "form",
		Meta:    map[string]any{MetaSessionID: string(t.s.id), MetaToolCallID: call.ID, MetaModel: t.model, MetaTool: ToolAskUser},
		RequestedSchema: acp.UnstableElicitationSchema{
			Type: acp.UnstableElicitationSchemaTypeObject, Properties: props, Required: required,
		},
	}})
	if ctx.Err() != nil {
		return "", errCancelled
	}
	if err != nil {
		var re *acp.RequestError
		if errors.As(err, &re) && re.Code == -32601 {
			return t.failCall(call.ID, "the client cannot answer questions; continue without asking"), nil
		}
		return t.failCall(call.ID, "the question could not be asked: "+err.Error()), nil
	}
	var answer map[string]any
	switch {
	case resp.Accept != nil:
		content := resp.Accept.Content
		if content == nil {
			content = map[string]any{}
		}
		answer = map[string]any{"action": "accept", "content": content}
	case resp.Decline != nil:
		answer = map[string]any{"action": "decline"}
	default:
		answer = map[string]any{"action": "cancel"}
	}
	_ = t.update(acp.UpdateToolCall(id, acp.WithUpdateStatus(acp.ToolCallStatusCompleted), acp.WithUpdateRawOutput(answer)))
	return toolJSON(answer), nil
}

// limitHint names the jail limit a command's status points to: SIGKILL
// from nobody in the turn is the kernel's OOM killer at the jail's memory
// limit, SIGXFSZ the largest-file limit (sh reports a killed child as
// 128+signal; -1 is sh itself, or the command it became, killed).
func limitHint(code int) string {
	switch code {
	case 128 + 9:
		return "the command was killed (SIGKILL): in a jail this is the out-of-memory killer, the intern's memory limit reached"
	case -1:
		return "the command was killed by a signal: in a jail most often the out-of-memory killer, the intern's memory limit reached"
	case 128 + 25:
		return "the command was stopped (SIGXFSZ): a file reached the intern's largest-file limit"
	}
	return ""
}
