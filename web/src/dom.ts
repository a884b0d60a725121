// A few helpers to build the DOM without a framework (the console stays small).
import { errorText } from "./api";
type Attrs = Record<string, string | boolean | undefined | ((e: Event) => void)>;
type Child = Node | string | null | undefined | false;

export function h(tag: string, attrs: Attrs = {}, ...children: Child[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else if (typeof v === "boolean") { if (v) el.setAttribute(k, ""); }
    else if (v !== undefined) el.setAttribute(k, v);
  }
  for (const c of children) if (c != null && c !== false) el.append(c);
  return el;
}

// Typed shorthands for the elements whose value we read.
export const input = (attrs: Attrs = {}) => h("input", attrs) as HTMLInputElement;
export const select = (attrs: Attrs, ...options: HTMLElement[]) => h("select", attrs, ...options) as HTMLSelectElement;
export const textarea = (attrs: Attrs = {}) => h("textarea", attrs) as HTMLTextAreaElement;
export const option = (value: string, label = value, selected = false) => h("option", { value, selected }, label);
export const button = (label: string, onclick: (e: Event) => void, attrs: Attrs = {}) =>
  h("button", { type: "button", ...attrs, onclick }, label) as HTMLButtonElement;

// message is a status line; errors are alerts so screen readers say them at once.
export function message(kind: "error" | "ok" | "note", text: string): HTMLElement {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text);
}

let seq = 0;
// uid gives ids for label/aria wiring.
export function uid(prefix: string): string {
  return `${prefix}-${++seq}`;
}

// field wraps a control in its label, with a slot for hints and errors that
// the control names in aria-describedby.
export function field(label: string, control: HTMLElement, hint?: string): HTMLElement {
  const id = control.id || uid("f");
  control.id = id;
  const help = h("span", { class: "hint", id: `${id}-hint` }, hint ?? "");
  const err = h("span", { class: "field-error", id: `${id}-err`, "aria-live": "polite" });
  control.setAttribute("aria-describedby", `${id}-hint ${id}-err`);
  const required = control.hasAttribute("required");
  const text = h("span", { class: "label" }, label, required ? h("span", { class: "req", "aria-hidden": "true" }, " *") : null);
  if (control instanceof HTMLInputElement && control.type === "checkbox") {
    return h("div", { class: "check" }, control, h("label", { for: id }, text), help, err);
  }
  return h("div", { class: "field" }, h("label", { for: id }, text), control, help, err);
}

// runes counts characters the way the service does (code points, not UTF-16 units).
export function runes(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

export type Rule = (value: string, el: HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement) => string;

const rules = new WeakMap<Element, Rule[]>();

// rule attaches a client-side check mirroring the service's validation. The
// message is shown next to the field; an empty string means valid.
export function rule<T extends HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement>(el: T, ...r: Rule[]): T {
  rules.set(el, [...(rules.get(el) ?? []), ...r]);
  el.addEventListener("input", () => check(el));
  return el;
}

function check(el: HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement): string {
  let msg = "";
  for (const r of rules.get(el) ?? []) {
    msg = r(el.value, el);
    if (msg) break;
  }
  el.setCustomValidity(msg);
  el.toggleAttribute("aria-invalid", msg !== "");
  const out = document.getElementById(`${el.id}-err`);
  if (out) out.textContent = msg;
  return msg;
}

// validate runs every rule in form and focuses the first failing control.
export function validate(form: HTMLElement): boolean {
  let first: HTMLElement | null = null;
  form.querySelectorAll<HTMLInputElement>("input, textarea, select").forEach((el) => {
    if (rules.has(el) && !el.disabled && check(el) && !first) first = el;
  });
  if (first) (first as HTMLElement).focus();
  return first === null;
}

// Rules shared by pages. Each reads the control's attributes where one
// exists, so a test can lift a bound to see the service's own answer.
export const required = (name: string): Rule => (v) => (v.trim() === "" ? `${name} is required` : "");
export const maxRunes = (name: string, max: number): Rule => (v) => {
  const n = runes(v);
  return n > max ? `${name} must be at most ${max} characters (got ${n})` : "";
};
export const noControl = (name: string, allowNewlines = false): Rule => (v) =>
  // eslint-disable-next-line no-control-regex
  (allowNewlines ? /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/ : /[\u0000-\u001f\u007f-\u009f]/).test(v)
    ? `${name} must not contain control characters`
    : "";
export const pattern = (msg: string): Rule => (v, el) => {
  const p = el.getAttribute("pattern");
  if (!p || v === "") return "";
  return new RegExp(`^(?:${p})$`, "v").test(v) ? "" : msg;
};

// when formats a protobuf timestamp for people.
export function when(ts: { seconds: bigint; nanos: number } | undefined): string {
  if (!ts) return "";
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6)).toLocaleString();
}

// table renders rows in a horizontally scrollable wrapper (phones).
// managementNote takes the place of what only a management key can do.
export function managementNote(what: string, kind: string): HTMLElement {
  return h("p", { class: "note needs-management" }, `${what} needs a management key; you are signed in with a ${kind} key.`);
}

export function table(caption: string, head: string[], rows: HTMLElement[]): HTMLElement {
  return h(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
    h("table", {}, h("caption", { class: "sr-only" }, caption), h("thead", {}, h("tr", {}, ...head.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, ...rows)),
  );
}

export function row(...cells: (Node | string)[]): HTMLElement {
  return h("tr", {}, ...cells.map((c) => h("td", {}, c)));
}

// confirmButton asks for a second press instead of a blocking dialog.
// ariaLabel names the target for screen readers (a row's "Delete" needs to
// say what it deletes).
export function confirmButton(label: string, confirmLabel: string, action: () => Promise<void>, ariaLabel = label): HTMLButtonElement {
  let armed = false;
  const b = button(label, async () => {
    if (!armed) {
      armed = true;
      b.textContent = confirmLabel;
      b.setAttribute("aria-label", `${confirmLabel}: ${ariaLabel}`);
      b.classList.add("danger");
      return;
    }
    b.disabled = true;
    try {
      await action();
    } finally {
      b.disabled = false;
    }
  }, { class: "secondary", "aria-label": ariaLabel });
  b.addEventListener("blur", () => {
    armed = false;
    b.setAttribute("aria-label", ariaLabel);
    b.textContent = label;
    b.classList.remove("danger");
  });
  return b;
}

// A page registers what to stop (an open chat stream) when the route changes.
let leaving: (() => void)[] = [];
export function onLeave(fn: () => void): void {
  leaving.push(fn);
}
export function leave(): void {
  const fns = leaving;
  leaving = [];
  for (const fn of fns) fn();
}

// actions makes the handlers of a list's buttons: each runs its call, shows
// what it did (or the API's refusal) in out, then reloads the list.
export function actions(out: HTMLElement, reload: () => Promise<void>) {
  return (call: () => Promise<string>) => async () => {
    let msg: HTMLElement;
    try {
      msg = message("ok", await call());
    } catch (err) {
      msg = message("error", errorText(err));
    }
    // The list first, then the message: when it shows, what it reports is
    // on screen, and nothing re-renders under the reader's next click.
    try {
      await reload();
    } finally {
      out.replaceChildren(msg);
    }
  };
}
