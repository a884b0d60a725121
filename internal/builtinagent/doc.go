// Package builtinagent is `cohort agent`: Cohort's built-in Agent Client Protocol
// (ACP) agent. It speaks ACP over stdio (github.com/coder/acp-go-sdk) and
// drives any OpenAI-compatible chat-completions endpoint with streaming, or
// the offline model `cohort/demo`. Its tools are `shell` (approval-bearing,
// sandboxed in manual mode by a nested jail, internal/jail) and `ask_user` (an ACP elicitation).
//
// # ACP methods
//
// initialize (no auth methods; loadSession only when a state directory is
// configured; text and resource-link prompts only), session/new,
// session/load (with a state directory: replays the conversation as
// user_message_chunk and agent_message_chunk updates), session/prompt,
// session/cancel, session/set_config_option (config option id "model",
// category model) and the unstable session/set_model. Others answer
// "method not found".
//
// # Conventions a client (the intern daemon) follows
//
//   - Approval mode: session/prompt `_meta["cohort.dev/approval_mode"]` =
//     "manual" or "self-drive", sent on every prompt (the mode belongs to the
//     run, not the session). session/new may carry the same key as the
//     session's default for prompts without one; with neither, the mode is
//     "manual". Any other value is an invalid-params error.
//   - manual: before each shell command the agent sends
//     session/request_permission with four options whose optionId equals
//     their kind: allow_once, allow_always, reject_once, reject_always. The
//     request's toolCall has title "shell", kind "execute", rawInput
//     {"command": …}; its `_meta["cohort.dev/tool"]` = "shell".
//     allow_once runs that command in the sandbox. allow_always is the
//     escalation: it lifts the sandbox, and the asking, for the rest of the
//     session's manual prompts. reject_once refuses that command;
//     reject_always refuses every later shell command of the session
//     without asking. The model is told of each refusal and continues. A
//     "cancelled" outcome ends the turn with stop reason cancelled.
//   - self-drive: the caller has consented, so the agent asks nothing and runs
//     the shell unsandboxed (grants remembered from manual prompts do not
//     apply). A client that still answers permission requests with allow in
//     this mode stays correct with other agents.
//   - Questions: the `ask_user` tool becomes an unstable elicitation/create in
//     form mode. The SDK's form request has no session field, so
//     `_meta["cohort.dev/session_id"]` names the session and
//     `_meta["cohort.dev/tool_call_id"]` the tool call. requestedSchema is an
//     object whose properties are the fields ({"type": string|number|integer|
//     boolean, "title": name, "enum": options}) with `required` listing the
//     required ones. accept (with content), decline and cancel are all
//     handed back to the model as {"action": …, "content": …}; the turn goes
//     on. Clients should advertise clientCapabilities.elicitation.form; one
//     that answers "method not found" makes the model continue without asking.
//   - Model: session/new (or session/load) `_meta["cohort.dev/model"]` or the "model" config
//     option (any id the upstream serves; "cohort/demo" is offline) picks the
//     session's model; the flag gives the default. Every session/update the
//     agent sends carries `_meta["cohort.dev/model"]`: the model id the
//     upstream returned (until the first answer, the session's model).
//   - Streaming: each model delta becomes an agent_message_chunk (text)
//     or agent_thought_chunk (reasoning). Consecutive deltas of one kind
//     and model that arrived together (the next already in the agent's
//     read buffer) go out as one update of at most 4 KiB of text; a delta
//     is never held while the agent waits for the upstream.
//   - Usage: PromptResponse.usage sums the turn's model calls (inputTokens,
//     outputTokens, totalTokens, and cachedReadTokens when the upstream
//     reported prompt_tokens_details.cached_tokens); it is absent when no call
//     reported usage. `_meta["cohort.dev/cost"]` (USD) is the sum of the
//     upstream's usage.cost, present only when one was reported.
//     PromptResponse `_meta["cohort.dev/model"]` repeats the model id.
//   - Failures: a failed model call ends session/prompt with a JSON-RPC error
//     (code -32603) whose message says what happened ("model upstream
//     returned HTTP 500: …", "model upstream timed out: …", "model upstream
//     closed the stream before the answer finished") and whose data is
//     {"reason": "turn_failed"} or {"reason": "timeout"}. session/cancel
//     ends the prompt with stop reason "cancelled" whatever it waited on (the
//     model stream, a permission, a question, a running command).
//
// # Bounds
//
// A model call waits at most the idle timeout (default 60 s) for its first
// byte and between chunks. A turn makes at most 32 model calls (then stop
// reason max_turn_requests). A shell command runs at most 60 s (its process
// group is killed) and the model sees at most 64 KiB of its combined output,
// with the total size reported. Commands run with an environment from which
// variables that look like credentials (…KEY…, …TOKEN…, …SECRET…,
// …PASSWORD…, COHORT_AGENT_*) are removed.
//
// # The offline model cohort/demo
//
// Deterministic and without network, it looks only at the last message:
//
//   - A prompt starting with "$ " asks to run the rest as a shell command
//     (one shell tool call; in manual mode a permission request). It then
//     answers "Shell result:\n" followed by the tool's JSON result
//     ({"exit_code": …, "output": …, "sandboxed": …}).
//   - A prompt ending with "?" asks a question (one ask_user call: message
//     `Before I answer "<prompt>": what answer do you expect?`, one required
//     string field "answer"), then answers "Thanks. You answered: <answer>",
//     or says the user declined or dismissed the question.
//   - Any other prompt is answered "Hello from cohort/demo. You said: <prompt>"
//     in three text chunks.
//
// Each answer is preceded by two or three reasoning chunks. The model id is
// "cohort/demo"; usage counts words (prompt tokens: words of the whole
// conversation; completion tokens: words produced); it reports no cost.
package builtinagent
