package turn

import (
	"fmt"
	"unicode/utf8"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// Limits of the chat request (the spec's Limits table).
const (
	MaxBody       = 1 << 20 // 1 MiB, bytes
	MaxPrompt     = 32000   // characters
	MaxSessionID  = 256     // characters
	MaxModel      = 256     // characters
	MaxToolCallID = 128     // characters
)

// Approval modes of the request.
const (
	ModeManual    = "manual"
	ModeSelfDrive = "self-drive"
)

// checked is a validated request: either a new run or an answer.
type checked struct {
	start     *interndv1.StartTurnRequest
	answer    *interndv1.AnswerRequest
	sessionID string
}

func chars(s string) int { return utf8.RuneCountInString(s) }

func between(field, v string, lo, hi int) error {
	if n := chars(v); n < lo || n > hi {
		return apierr.BadRequest("%s must be %d to %d characters, got %d", field, lo, hi, n)
	}
	return nil
}

// validate checks a request against the spec's rules; every error names the
// field. Only the last message is read, but every message must be well
// formed, since clients resend history and a malformed one is a client bug
// worth reporting.
func validate(req *cohortv1.StreamChatCompletionRequest) (*checked, error) {
	msgs := req.GetMessages()
	if len(msgs) == 0 {
		return nil, apierr.BadRequest("messages must have at least 1 item")
	}
	if req.Model != nil {
		if err := between("model", req.GetModel(), 1, MaxModel); err != nil {
			return nil, err
		}
	}
	if req.SessionId != nil {
		if err := between("session_id", req.GetSessionId(), 1, MaxSessionID); err != nil {
			return nil, err
		}
	}
	mode := interndv1.ApprovalMode_APPROVAL_MODE_SELF_DRIVE
	switch req.GetApprovalMode() {
	case "", ModeSelfDrive:
	case ModeManual:
		mode = interndv1.ApprovalMode_APPROVAL_MODE_MANUAL
	default:
		return nil, apierr.BadRequest("approval_mode must be %q or %q", ModeManual, ModeSelfDrive)
	}
	for i, m := range msgs {
		if err := checkMessage(i, m); err != nil {
			return nil, err
		}
	}
	i := len(msgs) - 1
	last := msgs[i]
	switch last.GetRole() {
	case "user":
		if last.Content == nil {
			return nil, apierr.BadRequest("messages[%d].content must be text: it is the prompt", i)
		}
		if n := chars(last.GetContent()); n > MaxPrompt {
			return nil, apierr.BadRequest("messages[%d].content is %d characters; the prompt may have at most %d", i, n, MaxPrompt)
		}
		return &checked{start: &interndv1.StartTurnRequest{SessionId: req.GetSessionId(), Prompt: last.GetContent(), ApprovalMode: mode}}, nil
	case "tool":
		if req.SessionId == nil {
			return nil, apierr.BadRequest("session_id is required when the last message has role tool")
		}
		if last.Content == nil {
			return nil, apierr.BadRequest("messages[%d].content must be text: it is the answer", i)
		}
		return &checked{sessionID: req.GetSessionId(), answer: &interndv1.AnswerRequest{
			SessionId: req.GetSessionId(), InteractionId: last.GetToolCallId(), Answer: last.GetContent()}}, nil
	default:
		return nil, apierr.BadRequest("messages[%d].role must be user or tool in the last message, not %s", i, last.GetRole())
	}
}

func checkMessage(i int, m *cohortv1.ChatMessage) error {
	f := func(name string) string { return fmt.Sprintf("messages[%d].%s", i, name) }
	switch m.GetRole() {
	case "system", "developer", "user", "assistant", "tool":
	case "":
		return apierr.BadRequest("%s is required", f("role"))
	default:
		return apierr.BadRequest("%s must be one of system, developer, user, assistant, tool; got %q", f("role"), m.GetRole())
	}
	// tool_calls on other roles and tool_call_id on other roles are not
	// read; they are ignored like other fields OpenAI clients may send.
	if m.GetRole() != "assistant" {
		return checkTool(i, m, f)
	}
	for j, tc := range m.GetToolCalls() {
		if err := between(fmt.Sprintf("messages[%d].tool_calls[%d].id", i, j), tc.GetId(), 1, MaxToolCallID); err != nil {
			return err
		}
	}
	return nil
}

func checkTool(i int, m *cohortv1.ChatMessage, f func(string) string) error {
	if m.GetRole() == "tool" {
		return between(f("tool_call_id"), m.GetToolCallId(), 1, MaxToolCallID)
	}
	return nil
}
