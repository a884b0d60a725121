// The chat playground: one prompt's turn streamed over the Connect server
// stream, reasoning apart from content, pauses answered in place (permission
// buttons for exactly the offered kinds, a form for a question), the same
// run streamed on after the answer, and a stop button that aborts the stream
// (the service cancels a run whose caller hangs up).
import { chat, errorText, errorReason } from "../api";
import type { ChatCompletionChunk, ToolCall } from "../gen/cohort/v1/chat_pb";
import { h, message, field, input, textarea, button, rule, validate, required, maxRunes, onLeave } from "../dom";
import { internSelect } from "../pickers";
import { Turn, finalDetails, pauseBlock, approvalModes } from "../transcript";

type ChatRequest = Parameters<typeof chat.streamChatCompletion>[0];

export async function chatPage(root: HTMLElement, internArg: string): Promise<void> {
  const loadOut = h("div");
  const intern = rule(await internSelect({ name: "intern", id: "chat-intern", required: true }, internArg, loadOut), required("intern"));
  const session = rule(input({ name: "session_id", id: "session", autocomplete: "off", spellcheck: "false" }), maxRunes("session_id", 256));
  const modes = approvalModes("mode", "Approval mode for this prompt");
  const prompt = rule(textarea({ name: "prompt", id: "prompt", rows: "3", required: true }), required("prompt"), maxRunes("prompt", 32000));
  const send = h("button", { type: "submit", id: "send" }, "Send") as HTMLButtonElement;
  const stop = button("Stop", () => current?.abort(), { id: "stop", class: "secondary", disabled: true });
  const status = h("p", { class: "status", role: "status", id: "chat-status" }, "Ready.");
  const log = h("div", { class: "transcript", role: "log", "aria-live": "polite", "aria-label": "Transcript" });

  let current: AbortController | null = null;
  // waiting: a run is paused on a question shown in the log; a new prompt
  // would only be refused (409) until it is answered.
  let waiting = false;
  const wait = (on: boolean) => {
    waiting = on;
    send.disabled = on || current !== null;
    if (on) send.title = "The intern is waiting for your answer to the pause above.";
    else send.removeAttribute("title");
  };
  onLeave(() => current?.abort());

  // stream runs one request and renders its chunks into turn; a pause
  // becomes a block that answers it and streams the same run on. A refusal
  // before the first chunk goes to refused when given (an answer shows it
  // in its pause), else into the turn.
  const stream = async (turn: Turn, req: ChatRequest, opened?: () => void, refused?: (err: unknown) => void): Promise<void> => {
    const ctl = new AbortController();
    current = ctl;
    send.disabled = true;
    stop.disabled = false;
    status.textContent = "Streaming…";
    let finish = "";
    let pending: ToolCall | null = null;
    let final: ChatCompletionChunk | null = null;
    let first = true;
    try {
      for await (const res of chat.streamChatCompletion(req, { signal: ctl.signal })) {
        const c = res.chunk;
        if (!c) continue;
        if (first) {
          first = false;
          opened?.();
        }
        const r = turn.chunk(c);
        if (r.final) final = c;
        if (r.call) pending = r.call;
        if (r.finish) finish = r.finish;
      }
    } catch (err) {
      if (ctl.signal.aborted) {
        turn.append(message("note", "Stopped: the run was cancelled."));
        status.textContent = "Stopped.";
      } else if (first && refused) {
        refused(err);
        status.textContent = "Refused.";
      } else {
        turn.append(message("error", errorText(err)));
        status.textContent = first ? "Refused." : "Failed.";
      }
      return;
    } finally {
      if (current === ctl) current = null;
      send.disabled = waiting;
      // Focus on the stop button (now disabled) or on an answered pause
      // (now gone) would fall to the page: keyboard users go on from the prompt.
      const lost = document.activeElement === stop || document.activeElement === document.body || !document.activeElement?.isConnected;
      stop.disabled = true;
      if (lost) prompt.focus();
    }
    const sid = final?.sessionId;
    if (sid !== undefined) session.value = sid;
    if (final) turn.append(finalDetails(final, finish));
    if (finish === "tool_calls" && pending && sid) {
      status.textContent = "Paused: the intern is waiting for your answer.";
      wait(true);
      const tc = pending;
      const pause: HTMLElement = pauseBlock(tc, async (content, label) => {
        await stream(
          turn,
          {
            internId: req.internId,
            sessionId: sid,
            messages: [
              // The streamed tool call, echoed unchanged, then the answer.
              { role: "assistant", toolCalls: [{ index: tc.index, id: tc.id, type: tc.type, function: { name: tc.function?.name ?? "", arguments: tc.function?.arguments ?? "" } }] },
              { role: "tool", toolCallId: tc.id, content },
            ],
          },
          () => {
            wait(false);
            pause.replaceWith(h("p", { class: "answered" }, `Answered: ${label}`));
          },
          (err) => {
            // A refused answer leaves the question pending (400) or tells
            // that it is gone (404, 409): only the first may be tried again.
            const again = errorReason(err) === "bad_request";
            if (!again) wait(false);
            pause.append(message("error", errorText(err)));
            pause.querySelectorAll<HTMLButtonElement | HTMLInputElement | HTMLSelectElement>("button, input, select").forEach((b) => (b.disabled = !again));
          },
        );
      });
      turn.append(pause);
      (pause.querySelector("button, input, select") as HTMLElement | null)?.focus();
    } else {
      status.textContent = finish === "error" ? "Failed." : finish === "stop" ? "Finished." : "Ended.";
    }
  };

  const form = h(
    "form",
    {
      novalidate: true,
      class: "prompt",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (current || waiting || !validate(e.target as HTMLElement)) return;
        const mode = modes.value();
        const turn = new Turn(h("p", { class: "user" }, h("span", { class: "who" }, `You (${mode})`), prompt.value));
        log.append(turn.el);
        const text = prompt.value;
        prompt.value = "";
        await stream(turn, {
          internId: intern.value,
          approvalMode: mode,
          sessionId: session.value || undefined,
          messages: [{ role: "user", content: text }],
        });
      },
    },
    field("Intern", intern),
    loadOut,
    field("Session id", session, "Empty starts a new session; filled in from each reply. The same id continues that session."),
    modes.el,
    field("Prompt", prompt, "Up to 32000 characters."),
    h("div", { class: "actions" }, send, stop, button("New session", () => { session.value = ""; wait(false); session.focus(); }, { class: "secondary" })),
  );
  root.append(h("h1", { tabindex: "-1" }, "Chat playground"), form, status, log);
}

