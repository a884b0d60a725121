// The chat playground: one prompt's turn streamed over the Connect server
// stream, reasoning apart from content, pauses answered in place (permission
// buttons for exactly the offered kinds, a form for a question), the same
// run streamed on after the answer, and a stop button that aborts the stream
// (the service cancels a run whose caller hangs up).
import { chat, errorText, errorReason } from "../api";
import type { ChatCompletionChunk, ChatUsage, ToolCall } from "../gen/cohort/v1/chat_pb";
import { h, message, field, input, select, textarea, option, button, rule, validate, required, maxRunes, onLeave, uid } from "../dom";
import { internSelect } from "../pickers";

const PERMISSION_LABELS: Record<string, string> = {
  allow_once: "Allow once",
  allow_always: "Allow always",
  reject_once: "Reject once",
  reject_always: "Reject always",
};

// title and input are Cohort's additions to the spec's fields: what is asked.
type Permission = { kind: "permission"; operation: string | null; options: string[]; title?: string; input?: string };
type FieldDesc = { name: string; type: string; required: boolean; options?: string[] };
type Elicitation = { kind: "elicitation"; message: string; fields: FieldDesc[] };
type Interaction = Permission | Elicitation;
const SERVICE_MODEL = "service/intern";
type ChatRequest = Parameters<typeof chat.streamChatCompletion>[0];

// Turn is one prompt's part of the transcript. Text goes into the current
// block; a pause closes the block so what the run says after the answer
// follows the pause.
class Turn {
  el: HTMLElement;
  private reasoning: HTMLElement | null = null;
  private content: HTMLElement | null = null;
  private models: HTMLElement;
  private seen: string[] = [];
  private current = "";

  constructor(prompt: string, mode: string) {
    this.models = h("span", { class: "models" });
    this.el = h(
      "article",
      { class: "turn" },
      h("p", { class: "user" }, h("span", { class: "who" }, `You (${mode})`), prompt),
      h("p", { class: "meta" }, "Model: ", this.models),
    );
  }

  // model records the chunk's model: text spans carry it (hover shows the
  // model of each chunk), and the line above lists the models in the order
  // they appeared. "service/intern" marks chunks the service emitted itself
  // and is listed only when the intern reported no model at all.
  model(m: string): void {
    this.current = m;
    if (m && !this.seen.includes(m)) this.seen.push(m);
    const real = this.seen.filter((x) => x !== SERVICE_MODEL);
    this.models.replaceChildren(...(real.length ? real : this.seen).flatMap((x, i) => [i ? " → " : "", h("code", {}, x)]));
  }

  // put appends text to block in a span of the current model; consecutive
  // chunks of one model share a span (a long answer is thousands of chunks).
  private put(block: HTMLElement, text: string): void {
    const last = block.lastElementChild as HTMLElement | null;
    if (last && last.dataset.model === this.current) {
      last.append(text);
      return;
    }
    block.append(h("span", { title: `model: ${this.current}`, "data-model": this.current }, text));
  }

  addReasoning(text: string): void {
    if (!this.reasoning) {
      this.reasoning = h("div", { class: "reasoning-text" });
      this.el.append(h("details", { class: "reasoning", open: true }, h("summary", {}, "Reasoning"), this.reasoning));
    }
    this.put(this.reasoning, text);
  }

  addContent(text: string): void {
    if (!this.content) {
      this.content = h("div", { class: "content" });
      this.el.append(this.content);
    }
    this.put(this.content, text);
  }

  // append adds a block (a pause, an error, the final details) and starts a
  // fresh text block after it.
  append(el: HTMLElement): void {
    this.el.append(el);
    this.reasoning = this.content = null;
  }
}

export async function chatPage(root: HTMLElement, internArg: string): Promise<void> {
  const loadOut = h("div");
  const intern = rule(await internSelect({ name: "intern", id: "chat-intern", required: true }, internArg, loadOut), required("intern"));
  const session = rule(input({ name: "session_id", id: "session", autocomplete: "off", spellcheck: "false" }), maxRunes("session_id", 256));
  const modeName = uid("mode");
  const manual = input({ type: "radio", name: modeName, value: "manual", id: "mode-manual", checked: true });
  const selfDrive = input({ type: "radio", name: modeName, value: "self-drive", id: "mode-self-drive" });
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
        turn.model(c.model);
        if (c.choices.length === 0) {
          final = c;
          continue;
        }
        for (const ch of c.choices) {
          const d = ch.delta;
          if (d?.reasoning) turn.addReasoning(d.reasoning);
          if (d?.content) turn.addContent(d.content);
          for (const tc of d?.toolCalls ?? []) pending = tc;
          if (ch.finishReason) finish = ch.finishReason;
        }
        if (c.error) turn.append(h("p", { class: "error", role: "alert" }, c.error.message, " ", h("code", {}, `(${c.error.code} ${c.error.reason})`)));
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
        const mode = manual.checked ? "manual" : "self-drive";
        const turn = new Turn(prompt.value, mode);
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
    h(
      "fieldset",
      { class: "mode" },
      h("legend", {}, "Approval mode for this prompt"),
      h("div", { class: "check" }, manual, h("label", { for: "mode-manual" }, "Manual: ask before each tool")),
      h("div", { class: "check" }, selfDrive, h("label", { for: "mode-self-drive" }, "Self-drive: consent for this run, unsandboxed shell")),
    ),
    field("Prompt", prompt, "Up to 32000 characters."),
    h("div", { class: "actions" }, send, stop, button("New session", () => { session.value = ""; wait(false); session.focus(); }, { class: "secondary" })),
  );
  root.append(h("h1", { tabindex: "-1" }, "Chat playground"), form, status, log);
}

// finalDetails shows the final chunk: session id and usage (with cost).
function finalDetails(c: ChatCompletionChunk, finish: string): HTMLElement {
  return h(
    "dl",
    { class: "final" },
    h("dt", {}, "Finish"), h("dd", {}, finish || "—"),
    h("dt", {}, "Session"), h("dd", { class: "mono session-id" }, c.sessionId ?? "null"),
    h("dt", {}, "Usage"), h("dd", { class: "usage" }, usageText(c.usage, finish)),
  );
}

function usageText(u: ChatUsage | undefined, finish: string): string {
  if (!u) return finish === "tool_calls" ? "none while paused" : "not reported";
  let s = `${u.promptTokens} prompt + ${u.completionTokens} completion = ${u.totalTokens} tokens`;
  if (u.cachedTokens !== undefined) s += ` (${u.cachedTokens} cached)`;
  if (u.cost !== undefined) s += ` · cost $${u.cost.toFixed(6)}`;
  return s;
}

function parseInteraction(tc: ToolCall): Interaction | null {
  try {
    const v = JSON.parse(tc.function?.arguments ?? "") as Interaction;
    return v.kind === "permission" || v.kind === "elicitation" ? v : null;
  } catch {
    return null;
  }
}

// pauseBlock renders the interaction; answer sends the tool message content.
function pauseBlock(tc: ToolCall, answer: (content: string, label: string) => Promise<void>): HTMLElement {
  const it = parseInteraction(tc);
  const title = uid("pause");
  const box = h("section", { class: "pause", "aria-labelledby": title });
  const send = async (content: string, label: string) => {
    box.querySelectorAll<HTMLButtonElement | HTMLInputElement>("button, input, select").forEach((b) => (b.disabled = true));
    await answer(content, label);
  };
  if (!it) {
    box.append(h("h3", { id: title }, "The intern is waiting for input the console does not understand"), h("pre", {}, tc.function?.arguments ?? ""),
      button("Cancel", () => void send("cancel", "cancel"), { class: "secondary" }));
    return box;
  }
  if (it.kind === "permission") {
    box.classList.add("permission");
    box.append(
      h("h3", { id: title }, "Permission requested"),
      h("p", {}, "The intern asks to use ", h("code", {}, it.operation ?? "a tool"), "."),
      ...(it.title && it.title !== it.operation ? [h("p", { class: "pause-title" }, it.title)] : []),
      ...(it.input ? [h("pre", { class: "pause-input", "aria-label": "What the tool would do" }, it.input)] : []),
      h(
        "div",
        { class: "actions" },
        ...it.options.map((k) =>
          button(PERMISSION_LABELS[k] ?? k, () => void send(k, PERMISSION_LABELS[k] ?? k), { "data-kind": k, class: k.startsWith("reject") ? "secondary" : "" }),
        ),
        button("Cancel", () => void send("cancel", "Cancel"), { "data-kind": "cancel", class: "secondary" }),
      ),
    );
    return box;
  }
  // A question: a form built from its field descriptors.
  const controls: [FieldDesc, HTMLInputElement | HTMLSelectElement][] = it.fields.map((f) => {
    let c: HTMLInputElement | HTMLSelectElement;
    if (f.options && f.options.length) {
      c = select({ name: f.name, required: f.required }, ...(f.required ? [option("", "Choose…")] : [option("", "—")]), ...f.options.map((o) => option(o)));
    } else if (f.type === "boolean") {
      c = input({ type: "checkbox", name: f.name });
    } else if (f.type === "number" || f.type === "integer") {
      c = input({ type: "number", name: f.name, required: f.required, step: f.type === "integer" ? "1" : "any" });
    } else {
      c = input({ type: "text", name: f.name, required: f.required, autocomplete: "off" });
    }
    if (f.required && !(c instanceof HTMLInputElement && c.type === "checkbox")) rule(c, required(f.name));
    return [f, c];
  });
  const collect = (): Record<string, unknown> => {
    const out: Record<string, unknown> = {};
    for (const [f, c] of controls) {
      if (c instanceof HTMLInputElement && c.type === "checkbox") out[f.name] = c.checked;
      else if (c.value === "") continue;
      else if (f.type === "number" || f.type === "integer") out[f.name] = Number(c.value);
      else out[f.name] = c.value;
    }
    return out;
  };
  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: (e: Event) => {
        e.preventDefault();
        if (!validate(form)) return;
        void send(JSON.stringify({ action: "accept", content: collect() }), "Accepted");
      },
    },
    ...controls.map(([f, c]) => field(f.name, c, f.required ? "Required." : undefined)),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit", "data-action": "accept" }, "Accept"),
      button("Decline", () => void send(JSON.stringify({ action: "decline" }), "Declined"), { class: "secondary", "data-action": "decline" }),
      button("Cancel", () => void send(JSON.stringify({ action: "cancel" }), "Cancelled"), { class: "secondary", "data-action": "cancel" }),
    ),
  );
  box.classList.add("question");
  box.append(h("h3", { id: title }, "Question"), h("p", {}, it.message), form);
  return box;
}
