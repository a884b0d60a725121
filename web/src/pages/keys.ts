// API keys: list, create (the key is shown once, with a copy button),
// disable, enable and delete. Every call needs a management key.
import { admin, errorText, keyKind, lacksManagement } from "../api";
import type { ApiKey } from "../gen/cohort/v1/admin_pb";
import { managementNote, h, message, field, input, select, option, button, rule, validate, table, row, when, maxRunes, noControl, confirmButton, actions } from "../dom";
import { listWorkspaces } from "../pickers";

export async function keysPage(root: HTMLElement): Promise<void> {
  if (lacksManagement()) {
    root.append(h("h1", { tabindex: "-1" }, "API keys"), managementNote("Listing and creating API keys", keyKind()));
    return;
  }
  const list = h("div");
  const out = h("div", { class: "out" });
  const rowOut = h("div", { class: "out" });
  const names = new Map<string, string>();

  const kind = select({ name: "kind" }, option("workspace"), option("personal"), option("management"));
  const name = rule(input({ name: "key_name", autocomplete: "off" }), maxRunes("name", 100), noControl("name"));
  const ws = rule(select({ name: "workspace_id" }, option("", "None")), (v) =>
    kind.value === "workspace" && v === "" ? "workspace_id is required for a workspace key" : "",
  );
  const wsField = field("Workspace", ws, "Required for a workspace key; a personal key's active workspace; none for a management key.");
  const syncKind = () => {
    ws.disabled = kind.value === "management";
    if (ws.disabled) ws.value = "";
    // A workspace key needs one: offer the first rather than an error.
    if (kind.value === "workspace" && ws.value === "" && ws.options.length > 1) ws.selectedIndex = 1;
  };
  kind.addEventListener("change", syncKind);

  const load = async () => {
    try {
      const res = await admin.listApiKeys({});
      list.replaceChildren(
        table("API keys", ["Name", "Kind", "Prefix", "Workspace", "Created", "State", "Actions"], res.apiKeys.map((k) => keyRow(k))),
      );
    } catch (err) {
      list.replaceChildren(message("error", errorText(err)));
    }
  };
  const act = (verb: string, fn: () => Promise<unknown>) => actions(rowOut, load)(async () => {
    await fn();
    return verb;
  });
  const keyRow = (k: ApiKey) =>
    row(
      k.name,
      k.kind,
      h("span", { class: "mono" }, `${k.prefix}…`),
      k.workspaceId ? names.get(k.workspaceId) ?? k.workspaceId : "—",
      when(k.createdAt),
      k.disabled ? "disabled" : "active",
      h(
        "div",
        { class: "actions" },
        k.disabled
          ? button("Enable", act(`Enabled ${k.name}`, () => admin.enableApiKey({ id: k.id })), { class: "secondary", "aria-label": `Enable ${k.name}` })
          : button("Disable", act(`Disabled ${k.name}`, () => admin.disableApiKey({ id: k.id })), { class: "secondary", "aria-label": `Disable ${k.name}` }),
        confirmButton("Delete", "Confirm delete", act(`Deleted ${k.name}`, () => admin.deleteApiKey({ id: k.id })), `Delete ${k.name}`),
      ),
    );

  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (!validate(e.target as HTMLElement)) return;
        try {
          const res = await admin.createApiKey({ kind: kind.value, name: name.value, workspaceId: ws.value });
          out.replaceChildren(shownOnce(res.key, res.apiKey?.name ?? ""));
          name.value = "";
          await load();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Kind", kind),
    field("Name", name, "Optional; up to 100 characters."),
    wsField,
    h("button", { type: "submit" }, "Create key"),
  );
  root.append(
    h("h1", { tabindex: "-1" }, "API keys"),
    h("p", { class: "hint" }, "Needs a management key. Keys are stored as hashes: a new key is shown once."),
    rowOut,
    list,
    h("h2", {}, "Create a key"),
    form,
    out,
  );
  try {
    for (const w of await listWorkspaces()) {
      names.set(w.id, w.name);
      ws.append(option(w.id, `${w.name} (${w.slug})`));
    }
  } catch (err) {
    out.replaceChildren(message("error", errorText(err)));
  }
  syncKind();
  await load();
}

// shownOnce shows a new key with a copy button. It lives only in this
// panel's DOM until dismissed; nothing stores it.
function shownOnce(key: string, name: string): HTMLElement {
  const box = input({ readonly: true, class: "mono", id: "new-key", spellcheck: "false", autocomplete: "off" });
  box.value = key;
  const status = h("span", { role: "status", class: "hint" });
  const panel = h(
    "section",
    { class: "once", "aria-labelledby": "once-title" },
    h("h3", { id: "once-title" }, `New key “${name}”`),
    h("p", { role: "alert" }, "Copy it now: this is the only time it is shown."),
    field("Key", box),
    h(
      "div",
      { class: "actions" },
      button("Copy", async () => {
        status.textContent = (await copy(box)) ? "Copied." : "Copy failed: select the key and copy it by hand.";
      }),
      button("I have stored it", () => panel.remove(), { class: "secondary" }),
      status,
    ),
  );
  return panel;
}

async function copy(box: HTMLInputElement): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(box.value);
    return true;
  } catch {
    // Not a secure context, or no permission: fall back to the selection.
    box.select();
    return document.execCommand("copy");
  }
}
