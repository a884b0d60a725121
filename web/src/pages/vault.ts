// Vault: store or replace an intern's secret. The value field is write-only:
// a password input, cleared after every submit, never echoed. The vault
// service has no list or audit RPC, so the page shows the metadata the
// store call returns (and what was stored from this tab, metadata only).
import { vault, errorText } from "../api";
import type { SecretMetadata } from "../gen/cohort/v1/vault_pb";
import { h, message, field, input, button, rule, validate, when, required, maxRunes, pattern, runes, type Rule } from "../dom";
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

// Secrets stored from this tab (metadata only), newest first.
const stored: SecretMetadata[] = [];

export async function vaultPage(root: HTMLElement, internArg: string): Promise<void> {
  const out = h("div", { class: "out" });
  const loadOut = h("div");
  const intern = rule(await internSelect({ name: "intern", id: "vault-intern", required: true }, internArg, loadOut), required("intern"));
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
  const history = h("div");
  const showHistory = () =>
    history.replaceChildren(...(stored.length ? [h("h2", {}, "Stored from this tab"), ...stored.map((m) => metadata(m))] : []));

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
        try {
          const res = await vault.putInternSecret({ internId: intern.value, name: name.value, hosts, value: secret });
          if (res.secret) {
            stored.unshift(res.secret);
            out.replaceChildren(message("ok", `${res.created ? "Stored" : "Replaced"} ${res.secret.name}`), metadata(res.secret));
          }
          showHistory();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Intern", intern),
    loadOut,
    field("Secret name", name, "Lowercase letters, digits and single underscores; starts with a letter; up to 255."),
    h("fieldset", {}, h("legend", {}, "Hosts the secret may be released to"), h("p", { class: "hint" }, "Exact DNS hostnames, 1 to 100; no scheme, port, path or wildcard."), hostList, add, hostErr),
    field("Value", value, "Write-only: encrypted at rest, never shown again. Storing under an existing name replaces it."),
    h("button", { type: "submit" }, "Store secret"),
  );
  root.append(
    h("h1", { tabindex: "-1" }, "Vault"),
    h("p", { class: "hint" }, "Needs a workspace key (or a personal key with an active workspace). The vault service offers no listing or audit RPC: this page shows the metadata each store returns."),
    form,
    out,
    history,
  );
  showHistory();
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
