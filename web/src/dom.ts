// A few helpers to build the DOM without a framework (the console stays small).
type Attrs = Record<string, string | boolean | ((e: Event) => void)>;

export function h(tag: string, attrs: Attrs = {}, ...children: (Node | string | null | undefined)[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else if (typeof v === "boolean") { if (v) el.setAttribute(k, ""); }
    else el.setAttribute(k, v);
  }
  for (const c of children) if (c != null) el.append(c);
  return el;
}

export function message(kind: "error" | "ok", text: string): HTMLElement {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text);
}

export function field(label: string, input: HTMLElement): HTMLElement {
  return h("label", {}, label, input);
}
