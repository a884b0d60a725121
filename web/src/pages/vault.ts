// Vault: store or replace a secret of an intern or of the whole workspace,
// list both vaults' secrets (metadata only) with paging and delete, and the
// organization's release audit. The value field is write-only: a password
// input, cleared on every submit, never echoed or kept.
import { vault, vaultAdmin, errorText, keyKind, lacksManagement } from "../api";
import type { SecretMetadata, SecretRelease } from "../gen/cohort/v1/vault_pb";
import { managementNote, h, message, field, input, select, option, button, rule, validate, when, required, maxRunes, pattern, runes, table, row, confirmButton, type Rule } from "../dom";
import { internSelect } from "../pickers";

const MAX_HOSTS = 100;
const NAME_PATTERN = "(?!.*__)[a-z](?:[a-z0-9_]*[a-z0-9])?";

// hostRule mirrors the shapes the service refuses, with its wording.
const hostRule: Rule = (raw) => {
  const v = raw;
  if (v === "") return "empty hostname";
  if (runes(v) > 254) return `is ${runes(v)} characters long: at most 254`;
  if (v.includes("://")) return "schemes are not allowed: give the bare hostname";
  if (v.includes("@")) return "userinfo is not allowed: give the bare hostname";
  if (/[/?#\\]/.test(v)) return "paths, queries and fragments are not allowed: give the bare hostname";
  if (v.includes("*")) return "wildcards are not allowed: list each exact hostname";
  if (/[[\]]/.test(v) || v.split(":").length > 2) return "IP addresses are not allowed: give a DNS hostname";
  if (v.includes(":")) return "ports are not allowed: give the bare hostname";
  return "";
};

export async function vaultPage(root: HTMLElement, internArg: string): Promise<void> {
  const out = h("div", { class: "out" });
  const loadOut = h("div");
  const scope = select({ name: "scope", id: "vault-scope" }, option("intern", "This intern"), option("workspace", "The whole workspace"));
  const internRequired = required("intern");
  const intern = rule(await internSelect({ name: "intern", id: "vault-intern", required: true }, internArg, loadOut), (v, el) =>
    scope.value === "workspace" ? "" : internRequired(v, el),
  );
  const internField = field("Intern", intern);
  // The intern picker stays usable for the intern's list below; it is only
  // left out of the store form's checks when the workspace is chosen.
  const syncScope = () => {
    const ws = scope.value === "workspace";
    intern.toggleAttribute("required", !ws);
    internField.querySelector(".req")?.toggleAttribute("hidden", ws);
    submit.textContent = ws ? "Store workspace secret" : "Store secret";
  };
  scope.addEventListener("change", syncScope);

  // The intern whose secrets are listed: a row's delete acts on it, even
  // if the picker moved since.
  let listed = "";
  const internSecrets = secretList(
    "Secrets of the intern",
    "intern",
    (after) => vault.listInternSecrets({ internId: (listed = intern.value), after }),
    (n) => vault.deleteInternSecret({ internId: listed, name: n }),
    () => (intern.value === "" ? "Choose an intern to list its secrets." : ""),
  );
  const workspaceSecrets = secretList(
    "Secrets of the workspace",
    "workspace",
    (after) => vault.listWorkspaceSecrets({ after }),
    (n) => vault.deleteWorkspaceSecret({ name: n }),
    () => "",
  );
  intern.addEventListener("change", () => void internSecrets.reload());
  const name = rule(
    input({ name: "secret_name", required: true, pattern: NAME_PATTERN, autocomplete: "off", spellcheck: "false" }),
    required("name"),
    maxRunes("name", 255),
    pattern("name may hold only lowercase letters, digits and single underscores, start with a letter and not end with an underscore"),
  );
  const hostList = h("ol", { class: "hosts" });
  const hostErr = h("p", { class: "field-error", "aria-live": "polite" });
  const addHost = (value = "") => {
    const n = hostList.children.length + 1;
    const hi = rule(input({ name: "host", autocomplete: "off", spellcheck: "false", inputmode: "url", placeholder: "api.example.com" }), hostRule);
    hi.value = value;
    const li = h("li", {}, field(`Host ${n}`, hi), button("Remove", () => {
      if (hostList.children.length === 1) {
        hi.value = "";
        hi.focus();
        return;
      }
      li.remove();
      renumber();
      (hostList.querySelector("input") as HTMLInputElement | null)?.focus();
    }, { class: "secondary", "aria-label": `Remove host ${n}` }));
    hostList.append(li);
    return hi;
  };
  const renumber = () => {
    [...hostList.children].forEach((li, i) => {
      li.querySelector(".label")!.firstChild!.textContent = `Host ${i + 1}`;
      li.querySelector("button")!.setAttribute("aria-label", `Remove host ${i + 1}`);
    });
  };
  addHost();
  const add = button("Add host", () => {
    if (hostList.children.length >= MAX_HOSTS) {
      hostErr.textContent = `hosts must have 1 to ${MAX_HOSTS} entries`;
      return;
    }
    addHost().focus();
  }, { class: "secondary" });
  const value = rule(
    input({ name: "value", type: "password", required: true, autocomplete: "new-password", spellcheck: "false" }),
    (v) => (v === "" ? "value is required" : ""),
    (v) => (runes(v) > 65536 ? `value must be 1 to 65536 characters, got ${runes(v)}` : ""),
  );

  const submit = h("button", { type: "submit" }, "Store secret");
  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        hostErr.textContent = "";
        if (!validate(e.target as HTMLElement)) return;
        const hosts = [...hostList.querySelectorAll<HTMLInputElement>("input")].map((i) => i.value);
        const secret = value.value;
        // Whatever happens next, the value leaves the page now.
        value.value = "";
        const ws = scope.value === "workspace";
        try {
          const res = ws
            ? await vault.putWorkspaceSecret({ name: name.value, hosts, value: secret })
            : await vault.putInternSecret({ internId: intern.value, name: name.value, hosts, value: secret });
          if (res.secret) {
            out.replaceChildren(message("ok", `${res.created ? "Stored" : "Replaced"} ${res.secret.name}`), metadata(res.secret));
          }
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
          return;
        }
        await (ws ? workspaceSecrets : internSecrets).reload();
      },
    },
    field("Store in", scope, "An intern's own secret, or one every intern of the workspace can use; the intern's own wins on a name in both."),
    internField,
    loadOut,
    field("Secret name", name, "Lowercase letters, digits and single underscores; starts with a letter; up to 255."),
    h("fieldset", {}, h("legend", {}, "Hosts the secret may be released to"), h("p", { class: "hint" }, "Exact DNS hostnames, 1 to 100; no scheme, port, path or wildcard."), hostList, add, hostErr),
    field("Value", value, "Write-only: encrypted at rest, never shown again. Storing under an existing name replaces it."),
    submit,
  );
  const audit = lacksManagement()
    ? h("section", { "aria-labelledby": "audit-title" }, h("h2", { id: "audit-title" }, "Release audit"), managementNote("The release audit", keyKind()))
    : await releaseAudit();
  root.append(
    h("h1", { tabindex: "-1" }, "Vault"),
    h(
      "p",
      { class: "hint" },
      "Storing, listing and deleting secrets needs a workspace key (or a personal key with an active workspace). The release audit needs a management key. Values are never shown: lists hold metadata only.",
    ),
    h("h2", {}, "Store or replace a secret"),
    form,
    out,
    internSecrets.el,
    workspaceSecrets.el,
    audit,
  );
  syncScope();
  await Promise.all([internSecrets.reload(), workspaceSecrets.reload()]);
}

type Page = { secrets: SecretMetadata[]; hasMore: boolean };

// secretList is one vault's secrets, a page at a time ("More" asks for the
// names after the last shown), each with a delete that asks twice.
function secretList(
  title: string,
  kind: string,
  fetch: (after: string) => Promise<Page>,
  del: (name: string) => Promise<unknown>,
  idle: () => string,
) {
  const id = `${kind}-secrets`;
  const msg = h("div", { class: "list-out" });
  const body = h("div");
  const more = button("More", () => void page(false), { class: "secondary", "aria-label": `More ${kind} secrets` });
  more.hidden = true;
  let shown: SecretMetadata[] = [];
  let last = "";
  const render = () =>
    body.replaceChildren(
      shown.length
        ? table(title, ["Name", "Hosts", "Fingerprint", "Created", "Actions"], shown.map((m) => secretRow(m)))
        : message("note", "No secrets."),
    );
  const secretRow = (m: SecretMetadata) =>
    row(
      h("span", { class: "mono" }, m.name),
      h("span", { class: "mono" }, m.hosts.length ? m.hosts.join(", ") : "none (legacy: never released)"),
      h("span", { class: "mono" }, m.fingerprint ?? "—"),
      when(m.createdAt),
      confirmButton("Delete", "Confirm delete", async () => {
        try {
          await del(m.name);
          msg.replaceChildren(message("ok", `Deleted ${m.name}`));
        } catch (err) {
          msg.replaceChildren(message("error", errorText(err)));
        }
        await page(true, false);
      }, `Delete ${kind} secret ${m.name}`),
    );
  // page loads the first page (fresh) or the next one; clear keeps the
  // delete's message when reloading after it.
  const page = async (fresh: boolean, clear = true) => {
    if (clear) msg.replaceChildren();
    const why = idle();
    if (why) {
      shown = [];
      more.hidden = true;
      body.replaceChildren(message("note", why));
      return;
    }
    try {
      const res = await fetch(fresh ? "" : last);
      shown = fresh ? res.secrets : [...shown, ...res.secrets];
      last = shown.length ? shown[shown.length - 1].name : "";
      more.hidden = !res.hasMore;
      render();
    } catch (err) {
      more.hidden = true;
      body.replaceChildren();
      msg.replaceChildren(message("error", errorText(err)));
    }
  };
  const el = h("section", { "aria-labelledby": id }, h("h2", { id }, title), msg, body, more);
  return { el, reload: () => page(true) };
}

// releaseAudit is the organization's release decisions, newest first, a
// page at a time ("More" asks for those before the last shown), optionally
// for one intern. Only a management key may read it; other keys see the
// API's refusal.
async function releaseAudit(): Promise<HTMLElement> {
  const loadOut = h("div");
  const filter = await internSelect({ name: "audit_intern", id: "audit-intern" }, "", loadOut);
  filter.options[0].textContent = "All interns";
  const names = new Map([...filter.options].map((o) => [o.value, o.textContent ?? o.value]));
  const msg = h("div", { class: "list-out" });
  const body = h("div");
  const more = button("More", () => void page(false), { class: "secondary", "aria-label": "More releases" });
  more.hidden = true;
  let shown: SecretRelease[] = [];
  const page = async (fresh: boolean) => {
    msg.replaceChildren();
    try {
      const res = await vaultAdmin.listSecretReleases({ internId: filter.value, before: fresh || !shown.length ? "" : shown[shown.length - 1].id });
      shown = fresh ? res.releases : [...shown, ...res.releases];
      more.hidden = !res.hasMore;
      body.replaceChildren(
        shown.length
          ? table("Release decisions", ["When", "Outcome", "Reason", "Secret", "Host", "Vault", "Intern", "Actor"], shown.map((r) =>
              row(
                when(r.createdAt),
                r.outcome,
                r.reason,
                h("span", { class: "mono" }, r.secretName),
                h("span", { class: "mono" }, r.host),
                r.vaultScope || "—",
                names.get(r.internId) ?? h("span", { class: "mono" }, r.internId),
                h("span", { class: "mono" }, r.actor),
              ),
            ))
          : message("note", "No release decisions."),
      );
    } catch (err) {
      more.hidden = true;
      body.replaceChildren();
      msg.replaceChildren(message("error", errorText(err)));
    }
  };
  const form = h(
    "form",
    { class: "inline", novalidate: true, onsubmit: (e: Event) => { e.preventDefault(); void page(true); } },
    field("Intern", filter, "Only this intern's decisions, or every intern's."),
    h("button", { type: "submit" }, "Show releases"),
  );
  await page(true);
  return h(
    "section",
    { "aria-labelledby": "audit-title" },
    h("h2", { id: "audit-title" }, "Release audit"),
    h("p", { class: "hint" }, "Every release and refusal of a secret to a host, newest first. Needs a management key."),
    form,
    loadOut,
    msg,
    body,
    more,
  );
}

function metadata(m: SecretMetadata): HTMLElement {
  return h(
    "dl",
    { class: "record" },
    h("dt", {}, "name"), h("dd", { class: "mono" }, m.name),
    h("dt", {}, "hosts"), h("dd", { class: "mono" }, m.hosts.length ? m.hosts.join(", ") : "null"),
    h("dt", {}, "fingerprint"), h("dd", { class: "mono" }, m.fingerprint ?? "null"),
    h("dt", {}, "created_at"), h("dd", {}, when(m.createdAt)),
  );
}
