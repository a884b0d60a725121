// What the playground and the runs page both show of a run: its chunks as
// a transcript (reasoning apart from content, the model of each chunk), the
// final chunk's details, and a pause's question with the controls that
// answer it.
import type { ChatCompletionChunk, ChatUsage, ToolCall } from "./gen/cohort/v1/chat_pb";
import { h, field, input, select, option, button, rule, validate, required, uid } from "./dom";

// approvalModes is the choice of approval mode for a prompt (manual first,
// the safer one); idPrefix names the radios ("mode" gives #mode-manual).
export function approvalModes(idPrefix: string, legend: string): { el: HTMLElement; value: () => string } {
  const name = uid("mode");
  const manual = input({ type: "radio", name, value: "manual", id: `${idPrefix}-manual`, checked: true });
  const selfDrive = input({ type: "radio", name, value: "self-drive", id: `${idPrefix}-self-drive` });
  const el = h(
    "fieldset",
    { class: "mode" },
    h("legend", {}, legend),
    h("div", { class: "check" }, manual, h("label", { for: manual.id }, "Manual: ask before each tool")),
    h("div", { class: "check" }, selfDrive, h("label", { for: selfDrive.id }, "Self-drive: consent for this run, unsandboxed shell")),
  );
  return { el, value: () => (manual.checked ? "manual" : "self-drive") };
}

export const PERMISSION_LABELS: Record<string, string> = {
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

// Turn is one run's part of the transcript (in the playground, one
// prompt's). Text goes into the current block; a pause closes the block so
// what the run says after the answer follows the pause.
export class Turn {
  el: HTMLElement;
  private reasoning: HTMLElement | null = null;
  private content: HTMLElement | null = null;
  private models: HTMLElement;
  private seen: string[] = [];
  private current = "";

  // head opens the turn: the prompt in the playground, nothing on the
  // runs page (a run's record does not keep its prompt).
  constructor(head?: HTMLElement) {
    this.models = h("span", { class: "models" });
    this.el = h("article", { class: "turn" }, head, h("p", { class: "meta" }, "Model: ", this.models));
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

  // chunk shows one chunk of the run. It reports the final chunk (no
  // choices: the caller shows its details), the tool call a pause asks
  // with, and the finish reason.
  chunk(c: ChatCompletionChunk): { final: boolean; call: ToolCall | null; finish: string } {
    this.model(c.model);
    const out = { final: c.choices.length === 0, call: null as ToolCall | null, finish: "" };
    for (const ch of c.choices) {
      const d = ch.delta;
      if (d?.reasoning) this.addReasoning(d.reasoning);
      if (d?.content) this.addContent(d.content);
      for (const tc of d?.toolCalls ?? []) out.call = tc;
      if (ch.finishReason) out.finish = ch.finishReason;
    }
    if (c.error) this.append(h("p", { class: "error", role: "alert" }, c.error.message, " ", h("code", {}, `(${c.error.code} ${c.error.reason})`)));
    return out;
  }

  // append adds a block (a pause, an error, the final details) and starts a
  // fresh text block after it.
  append(el: HTMLElement): void {
    this.el.append(el);
    this.reasoning = this.content = null;
  }
}

// finalDetails shows the final chunk: session id and usage (with cost).
export function finalDetails(c: ChatCompletionChunk, finish: string): HTMLElement {
  return h(
    "dl",
    { class: "final" },
    h("dt", {}, "Finish"), h("dd", {}, finish || "—"),
    h("dt", {}, "Session"), h("dd", { class: "mono session-id" }, c.sessionId ?? "null"),
    h("dt", {}, "Usage"), h("dd", { class: "usage" }, usageText(c.usage, finish)),
  );
}

export function usageText(u: ChatUsage | undefined, finish: string): string {
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
export function pauseBlock(tc: ToolCall, answer: (content: string, label: string) => Promise<void>): HTMLElement {
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
