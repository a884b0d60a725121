// Workload identity settings: issuers, policies (every field of the spec,
// claim checks added and removed one by one, the enable switch, the CEL
// condition checked by the server as it is typed), a dry run of a pasted
// token against a policy, and the exchange audit. Needs a management key of
// an organization with the workload identity entitlement.
import { admin, federation, errorText, keyKind, lacksManagement } from "../api";
import type { ClaimCheck, FederationIssuer, FederationPolicy, Exchange } from "../gen/cohort/v1/federation_pb";
import type { ApiKey } from "../gen/cohort/v1/admin_pb";
import {
  managementNote, h, message, field, input, select, textarea, option, button, rule, validate, table, row, when,
  required, maxRunes, noControl, runes, confirmButton, uid, actions, type Rule,
} from "../dom";

const CLAIM_KINDS = ["scopes", "token_type"];
const MAX_CONDITION = 2000;
const MAX_POLICY_STRING = 512;

// httpsURL mirrors the service's URL rules for issuer and JWKS URLs.
const httpsURL = (name: string, optional: boolean): Rule => (v) => {
  if (v === "") return optional ? "" : `${name} is required`;
  if (new TextEncoder().encode(v).length > 1024) return `${name} must be at most 1024 bytes`;
  // eslint-disable-next-line no-control-regex
  if (/[\s\u0000-\u001f\u007f]/.test(v)) return `${name} must not contain spaces or control characters`;
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    return `${name} is not a URL`;
  }
  if (u.protocol !== "https:") return `${name} must start with https://`;
  if (!u.hostname) return `${name} must name a host`;
  if (u.username || u.password) return `${name} must not carry credentials`;
  if (v.includes("#")) return `${name} must not have a fragment`;
  if (v.includes("?")) return `${name} must not have a query`;
  return "";
};

type State = { issuers: FederationIssuer[]; policies: FederationPolicy[]; keys: ApiKey[] };

export async function federationPage(root: HTMLElement): Promise<void> {
  if (lacksManagement()) {
    root.append(h("h1", { tabindex: "-1" }, "Workload identity"), managementNote("Workload identity federation", keyKind()));
    return;
  }
  const st: State = { issuers: [], policies: [], keys: [] };
  const loadOut = h("div");
  const issuersBox = h("div");
  const policiesBox = h("div");
  const issuerOut = h("div", { class: "out" });
  const policyOut = h("div", { class: "out" });
  const auditBox = h("div");

  const refresh = async () => {
    try {
      const [is, ps, ks] = await Promise.all([federation.listIssuers({}), federation.listPolicies({}), admin.listApiKeys({})]);
      st.issuers = is.issuers;
      st.policies = ps.policies;
      st.keys = ks.apiKeys;
      loadOut.replaceChildren();
    } catch (err) {
      loadOut.replaceChildren(message("error", errorText(err)));
    }
    issuersBox.replaceChildren(issuerTable());
    policiesBox.replaceChildren(...(st.policies.length ? st.policies.map(policyCard) : [message("note", "No policies yet.")]));
    policyEditor.refreshOptions();
    const v = auditPolicy.value;
    auditPolicy.replaceChildren(option("", "All policies"),
      ...st.policies.map((p) => option(p.id, `${st.issuers.find((i) => i.id === p.issuerId)?.name ?? ""} · ${p.audience} · ${p.id.slice(0, 8)}`)));
    auditPolicy.value = v;
  };

  // ---- Issuers ----
  let editingIssuer: FederationIssuer | null = null;
  const iName = rule(input({ name: "issuer_name", required: true, autocomplete: "off" }), required("name"), maxRunes("name", 100), noControl("name"));
  const iURL = rule(input({ name: "issuer_url", required: true, type: "url", inputmode: "url", spellcheck: "false", placeholder: "https://idp.example.com" }), httpsURL("issuer_url", false));
  const iJWKS = rule(input({ name: "jwks_url", type: "url", inputmode: "url", spellcheck: "false" }), httpsURL("jwks_url", true));
  const iSubmit = h("button", { type: "submit" }, "Add issuer") as HTMLButtonElement;
  const iCancel = button("Cancel edit", () => resetIssuer(), { class: "secondary", hidden: true });
  const resetIssuer = () => {
    editingIssuer = null;
    iName.value = iURL.value = iJWKS.value = "";
    iSubmit.textContent = "Add issuer";
    iCancel.hidden = true;
  };
  const issuerFormEl = h(
    "form",
    {
      novalidate: true,
      "aria-label": "Issuer",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (!validate(issuerFormEl)) return;
        try {
          if (editingIssuer) {
            const res = await federation.updateIssuer({ id: editingIssuer.id, name: iName.value, issuerUrl: iURL.value, jwksUrl: iJWKS.value });
            issuerOut.replaceChildren(message("ok", `Saved issuer ${res.issuer?.name}`));
          } else {
            const res = await federation.createIssuer({ name: iName.value, issuerUrl: iURL.value, jwksUrl: iJWKS.value });
            issuerOut.replaceChildren(message("ok", `Added issuer ${res.issuer?.name}`));
          }
          resetIssuer();
          await refresh();
        } catch (err) {
          issuerOut.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Name", iName, "A label, up to 100 characters."),
    field("Issuer URL", iURL, "Must equal the iss claim of its tokens exactly; https only."),
    field("JWKS URL", iJWKS, "Optional; empty reads jwks_uri from the issuer's /.well-known/openid-configuration."),
    h("div", { class: "actions" }, iSubmit, iCancel),
  );
  const issuerTable = () =>
    st.issuers.length
      ? table(
          "Issuers",
          ["Name", "Issuer URL", "JWKS URL", "Created", "Actions"],
          st.issuers.map((i) =>
            row(
              i.name,
              h("span", { class: "mono" }, i.issuerUrl),
              i.jwksUrl ? h("span", { class: "mono" }, i.jwksUrl) : "discovery",
              when(i.createdAt),
              h(
                "div",
                { class: "actions" },
                button("Edit", () => {
                  editingIssuer = i;
                  iName.value = i.name;
                  iURL.value = i.issuerUrl;
                  iJWKS.value = i.jwksUrl;
                  iSubmit.textContent = "Save issuer";
                  iCancel.hidden = false;
                  iName.focus();
                }, { class: "secondary", "aria-label": `Edit issuer ${i.name}` }),
                confirmButton("Delete", "Delete it and its policies", actions(issuerOut, refresh)(async () => {
                  const res = await federation.deleteIssuer({ id: i.id });
                  return `Deleted issuer ${i.name} and ${res.deletedPolicies} policies`;
                }), `Delete issuer ${i.name}`),
              ),
            ),
          ),
        )
      : message("note", "No issuers yet.");

  // ---- Policy editor (create, or edit the fields UpdatePolicy takes) ----
  const policyEditor = makePolicyEditor(st, policyOut, refresh);

  // ---- A policy: its fields, enable switch, claim checks one by one, dry run ----
  const act = actions(policyOut, refresh);
  const policyCard = (p: FederationPolicy): HTMLElement => {
    const out = h("div", { class: "out" });
    const issuer = st.issuers.find((i) => i.id === p.issuerId);
    const key = st.keys.find((k) => k.id === p.apiKeyId);
    const title = uid("pol");
    const enabled = input({ type: "checkbox", role: "switch", checked: p.enabled, name: "enabled" });
    enabled.addEventListener("change", async () => {
      try {
        await federation.updatePolicy({ id: p.id, enabled: enabled.checked });
        out.replaceChildren(message("ok", enabled.checked ? "Enabled: exchanges are accepted." : "Paused: exchanges are refused."));
      } catch (err) {
        enabled.checked = !enabled.checked;
        out.replaceChildren(message("error", errorText(err)));
      }
    });
    const checks = h("ul", { class: "claim-checks" }, ...p.claimChecks.map((c) =>
      h("li", {}, h("code", {}, c.kind), " = ", h("code", {}, c.value), " ",
        button("Remove", act(async () => {
          await federation.removeClaimCheck({ policyId: p.id, kind: c.kind });
          return `Removed the ${c.kind} check`;
        }), { class: "secondary", "aria-label": `Remove the ${c.kind} check` })),
    ));
    const free = CLAIM_KINDS.filter((k) => !p.claimChecks.some((c) => c.kind === k));
    const addKind = select({ name: "claim_kind" }, ...free.map((k) => option(k)));
    const addValue = rule(input({ name: "claim_value", autocomplete: "off", spellcheck: "false" }), required("value"), maxRunes("value", MAX_POLICY_STRING));
    const addForm = h(
      "form",
      {
        class: "inline",
        novalidate: true,
        "aria-label": "Add a claim check",
        onsubmit: async (e: Event) => {
          e.preventDefault();
          if (!validate(addForm)) return;
          await act(async () => {
            await federation.setClaimCheck({ policyId: p.id, check: { kind: addKind.value, value: addValue.value } });
            return `Added the ${addKind.value} check`;
          })();
        },
      },
      field("Kind", addKind),
      field("Value", addValue),
      h("button", { type: "submit", class: "secondary" }, "Add check"),
    );
    return h(
      "section",
      { class: "policy", "aria-labelledby": title, "data-policy": p.id },
      h("h3", { id: title }, `Policy for ${issuer?.name ?? p.issuerId}`),
      h(
        "dl",
        { class: "record" },
        h("dt", {}, "federation_policy_id"), h("dd", { class: "mono" }, p.id),
        h("dt", {}, "Issuer"), h("dd", { class: "mono" }, issuer ? `${issuer.name} (${issuer.issuerUrl})` : p.issuerId),
        h("dt", {}, "Subject"), h("dd", { class: "mono" }, p.subject || "any (the condition decides)"),
        h("dt", {}, "Audience"), h("dd", { class: "mono" }, p.audience),
        h("dt", {}, "Condition"), h("dd", { class: "mono" }, p.condition || "none"),
        h("dt", {}, "Acts as API key"), h("dd", {}, key ? `${key.name} (${key.prefix}…)` : p.apiKeyId),
        h("dt", {}, "Updated"), h("dd", {}, when(p.updatedAt ?? p.createdAt)),
      ),
      field("Enabled", enabled, "Off pauses the policy: new exchanges fail at once."),
      h("h4", {}, "Claim checks"),
      p.claimChecks.length ? checks : h("p", { class: "hint" }, "None."),
      free.length ? addForm : h("p", { class: "hint" }, "Both kinds are set; remove one to change it."),
      h(
        "div",
        { class: "actions" },
        button("Edit", () => policyEditor.edit(p), { class: "secondary", "aria-label": "Edit this policy" }),
        confirmButton("Delete", "Confirm delete", act(async () => {
          await federation.deletePolicy({ id: p.id });
          return "Deleted the policy";
        }), "Delete this policy"),
      ),
      out,
      dryRun(p),
    );
  };

  // ---- Exchange audit ----
  const auditPolicy = select({ name: "audit_policy", id: "audit-policy" }, option("", "All policies"));
  let next = "";
  const auditRows: Exchange[] = [];
  const more = button("Load more", () => void loadAudit(false), { class: "secondary", hidden: true });
  const loadAudit = async (reset: boolean) => {
    if (reset) {
      auditRows.length = 0;
      next = "";
    }
    try {
      const res = await federation.listExchanges({ policyId: auditPolicy.value, pageSize: 50, pageToken: next });
      auditRows.push(...res.exchanges);
      next = res.nextPageToken;
      more.hidden = next === "";
      const tbl = auditRows.length
          ? table("Exchange audit", ["Time", "Outcome", "Failed check", "Detail", "Subject", "Policy", "Source", "Token id", "API key"],
              auditRows.map((x) => row(when(x.time), h("span", { class: `outcome-${x.outcome}` }, x.outcome), x.failedCheck, x.detail,
                h("span", { class: "mono" }, x.subject), h("span", { class: "mono" }, x.policyId), x.sourceAddress,
                h("span", { class: "mono" }, x.tokenId), h("span", { class: "mono" }, x.apiKeyId))))
          : message("note", "No exchanges recorded.");
      tbl.querySelector("table")?.setAttribute("data-audit", "");
      auditBox.replaceChildren(tbl);
    } catch (err) {
      auditBox.replaceChildren(message("error", errorText(err)));
    }
  };
  auditPolicy.addEventListener("change", () => void loadAudit(true));

  root.append(
    h("h1", { tabindex: "-1" }, "Workload identity"),
    h("p", { class: "hint" }, "Needs a management key of an organization with workload identity federation. Workloads exchange their identity provider's JWT at POST /api/v1/oauth/token for an access token acting as the policy's API key."),
    loadOut,
    h("h2", {}, "Issuers"),
    issuersBox,
    issuerOut,
    issuerFormEl,
    h("h2", {}, "Policies"),
    policyOut,
    policiesBox,
    policyEditor.el,
    h("h2", {}, "Exchange audit"),
    h("div", { class: "toolbar" }, field("Policy", auditPolicy), button("Refresh", () => void loadAudit(true), { class: "secondary", "aria-label": "Refresh the audit" })),
    auditBox,
    more,
  );
  await refresh();
  await loadAudit(true);
}

// makePolicyEditor builds the form that creates a policy or edits the
// fields of one. The condition is checked by the server as it is typed.
function makePolicyEditor(st: State, out: HTMLElement, refresh: () => Promise<void>) {
  let editing: FederationPolicy | null = null;
  const heading = h("h3", { id: "policy-editor-title" }, "New policy");
  const issuer = rule(select({ name: "issuer_id", required: true }), required("issuer"));
  const subject = rule(input({ name: "subject", autocomplete: "off", spellcheck: "false" }), maxRunes("subject", MAX_POLICY_STRING));
  const audience = rule(input({ name: "audience", required: true, autocomplete: "off", spellcheck: "false" }), required("audience"), maxRunes("audience", MAX_POLICY_STRING));
  const condStatus = h("p", { class: "cond-status", role: "status", id: "condition-status" });
  let verdict: { text: string; valid: boolean; message: string } | null = null;
  const condition = rule(
    textarea({ name: "condition", rows: "3", spellcheck: "false", placeholder: `subject.startsWith("repo:acme/") && "deploy" in scopes` }),
    (v) => (runes(v) > MAX_CONDITION ? `condition must be at most ${MAX_CONDITION} characters (got ${runes(v)})` : ""),
    (v) => (verdict && verdict.text === v && !verdict.valid ? verdict.message : ""),
  );
  const apiKey = rule(select({ name: "api_key_id", required: true }), required("API key"));
  const enabled = input({ type: "checkbox", role: "switch", name: "new_enabled", checked: true });
  const enabledField = field("Enabled", enabled, "Off creates the policy paused.");
  const oneOf = h("p", { class: "field-error", "aria-live": "polite" });

  // Claim checks of a new policy, added and removed one by one before saving.
  const pending: ClaimCheck[] = [];
  const checkList = h("ul", { class: "claim-checks" });
  const ccKind = select({ name: "new_claim_kind" });
  const ccValue = rule(input({ name: "new_claim_value", autocomplete: "off", spellcheck: "false" }), maxRunes("value", MAX_POLICY_STRING));
  const ccErr = h("p", { class: "field-error", "aria-live": "polite" });
  const drawChecks = () => {
    checkList.replaceChildren(...pending.map((c, i) => h("li", {}, h("code", {}, c.kind), " = ", h("code", {}, c.value), " ",
      button("Remove", () => {
        pending.splice(i, 1);
        drawChecks();
        ccKind.focus();
      }, { class: "secondary", "aria-label": `Remove the ${c.kind} check` }))));
    const free = CLAIM_KINDS.filter((k) => !pending.some((c) => c.kind === k));
    ccKind.replaceChildren(...free.map((k) => option(k)));
    ccBlock.hidden = free.length === 0;
  };
  const ccBlock = h("div", { class: "toolbar" }, field("Kind", ccKind), field("Value", ccValue),
    button("Add check", () => {
      ccErr.textContent = ccValue.value === "" ? `claim check ${ccKind.value} needs a value` : "";
      if (ccErr.textContent || !validate(ccBlock)) return;
      pending.push({ kind: ccKind.value, value: ccValue.value } as ClaimCheck);
      ccValue.value = "";
      drawChecks();
    }, { class: "secondary" }));
  const checksSet = h("fieldset", {}, h("legend", {}, "Claim checks"),
    h("p", { class: "hint" }, "scopes: the token's scopes array contains the value. token_type: the token's token_type claim equals it. Each kind at most once."),
    checkList, ccBlock, ccErr);

  // Validate the condition on the server as it is typed (debounced).
  let timer = 0;
  let asked = 0;
  const check = async () => {
    const text = condition.value;
    if (text.trim() === "") {
      verdict = null;
      condStatus.textContent = "";
      condStatus.className = "cond-status";
      return;
    }
    const n = ++asked;
    try {
      const res = await federation.validateCondition({ condition: text });
      if (n !== asked) return; // a newer check is under way
      verdict = { text, valid: res.valid, message: res.message };
      condStatus.textContent = res.valid ? "The condition is valid." : res.message;
      condStatus.className = `cond-status ${res.valid ? "valid" : "invalid"}`;
    } catch (err) {
      if (n === asked) condStatus.textContent = errorText(err);
    }
  };
  condition.addEventListener("input", () => {
    clearTimeout(timer);
    condStatus.textContent = "Checking…";
    condStatus.className = "cond-status";
    timer = window.setTimeout(() => void check(), 300);
  });

  const submit = h("button", { type: "submit" }, "Create policy") as HTMLButtonElement;
  const cancel = button("Cancel edit", () => reset(), { class: "secondary", hidden: true });
  const reset = () => {
    editing = null;
    heading.textContent = "New policy";
    submit.textContent = "Create policy";
    cancel.hidden = true;
    issuer.disabled = false;
    enabledField.hidden = checksSet.hidden = false;
    subject.value = audience.value = condition.value = "";
    enabled.checked = true;
    pending.length = 0;
    verdict = null;
    condStatus.textContent = "";
    drawChecks();
  };
  const el = h(
    "form",
    {
      novalidate: true,
      class: "policy-editor",
      "aria-labelledby": "policy-editor-title",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        oneOf.textContent = "";
        clearTimeout(timer);
        if (condition.value.trim() !== "" && verdict?.text !== condition.value) await check();
        if (!validate(el)) return;
        if (subject.value === "" && condition.value === "") {
          oneOf.textContent = "a policy must set a subject, a condition, or both";
          subject.focus();
          return;
        }
        try {
          if (editing) {
            await federation.updatePolicy({ id: editing.id, subject: subject.value, audience: audience.value, condition: condition.value, apiKeyId: apiKey.value });
            out.replaceChildren(message("ok", "Saved the policy"));
          } else {
            const res = await federation.createPolicy({
              issuerId: issuer.value, subject: subject.value, audience: audience.value, condition: condition.value,
              apiKeyId: apiKey.value, enabled: enabled.checked, claimChecks: pending.slice(),
            });
            out.replaceChildren(message("ok", `Created policy ${res.policy?.id}`));
          }
          reset();
          await refresh();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    heading,
    field("Issuer", issuer, "The issuer that signs the tokens."),
    field("Subject", subject, "Optional: when set, must equal the token's sub exactly."),
    field("Audience", audience, "Must equal one of the token's aud values exactly."),
    field("Condition (CEL)", condition, "Optional. Variables: subject, audience, scopes, token_type. Must yield a boolean; at most 2,000 characters; no matches(); no nested comprehensions."),
    condStatus,
    oneOf,
    field("Acts as API key", apiKey, "A workspace API key; personal and management keys cannot be targeted."),
    enabledField,
    checksSet,
    h("div", { class: "actions" }, submit, cancel),
  );
  drawChecks();
  return {
    el,
    refreshOptions: () => {
      const [iv, kv] = [issuer.value, apiKey.value];
      issuer.replaceChildren(option("", "Choose an issuer"), ...st.issuers.map((i) => option(i.id, `${i.name} (${i.issuerUrl})`)));
      apiKey.replaceChildren(option("", "Choose a workspace key"),
        ...st.keys.filter((k) => k.kind === "workspace").map((k) => option(k.id, `${k.name} (${k.prefix}…)${k.disabled ? " — disabled" : ""}`)));
      issuer.value = iv;
      apiKey.value = kv;
    },
    edit: (p: FederationPolicy) => {
      editing = p;
      heading.textContent = "Edit policy";
      submit.textContent = "Save policy";
      cancel.hidden = false;
      issuer.value = p.issuerId;
      issuer.disabled = true; // a policy keeps its issuer
      subject.value = p.subject;
      audience.value = p.audience;
      condition.value = p.condition;
      apiKey.value = p.apiKeyId;
      // The switch and the claim checks of a saved policy live on its card.
      enabledField.hidden = checksSet.hidden = true;
      verdict = null;
      void check();
      el.scrollIntoView();
      subject.focus();
    },
  };
}

// dryRun tests a pasted subject token against the policy, check by check.
function dryRun(p: FederationPolicy): HTMLElement {
  const token = rule(textarea({ name: "subject_token", rows: "3", spellcheck: "false", autocomplete: "off" }), required("subject token"));
  const result = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (!validate(form)) return;
        try {
          const res = await federation.dryRun({ policyId: p.id, subjectToken: token.value.trim() });
          result.replaceChildren(
            message(res.wouldIssue ? "ok" : "error", res.wouldIssue ? "An exchange would issue a token now." : `An exchange would be refused: ${res.failedCheck} fails.`),
            h("ol", { class: "steps" }, ...res.steps.map((s) =>
              h("li", { class: s.outcome, "data-check": s.check }, h("strong", {}, s.check), ` — ${s.outcome.replace("_", " ")}`, s.detail ? `: ${s.detail}` : ""))),
          );
        } catch (err) {
          result.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Subject token (JWT)", token, "Not stored or logged; no token is issued."),
    h("button", { type: "submit", class: "secondary" }, "Run the checks"),
  );
  return h("details", { class: "dry-run" }, h("summary", {}, "Dry run"), form, result);
}
