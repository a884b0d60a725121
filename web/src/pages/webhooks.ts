// Webhooks: a workspace's endpoints (create with the secret shown once,
// enable or disable, rotate the secret, delete) and an endpoint's delivery
// log with redelivery. The secret lives only in the panel that shows it.
import { webhooks, errorText } from "../api";
import type { WebhookEndpoint, WebhookDelivery } from "../gen/cohort/v1/webhook_pb";
import { h, message, field, input, button, rule, validate, required, maxRunes, noControl, table, row, when, confirmButton, actions } from "../dom";
import { workspaceSelect } from "../pickers";

const EVENTS = ["run.paused", "run.completed", "run.failed", "run.cancelled"];

export async function webhooksPage(root: HTMLElement): Promise<void> {
  const loadOut = h("div");
  const out = h("div", { class: "out" });
  const rowOut = h("div", { class: "out" });
  const list = h("div");
  const log = h("section", { "aria-live": "polite" });
  const ws = await workspaceSelect({ name: "workspace_id", id: "hooks-ws" }, loadOut);

  const load = async () => {
    try {
      const res = await webhooks.listWebhookEndpoints({ workspaceId: ws.value });
      list.replaceChildren(
        res.endpoints.length === 0
          ? message("note", "No endpoints in this workspace.")
          : table("Webhook endpoints", ["URL", "Events", "Description", "State", "Created", "Actions"], res.endpoints.map(endpointRow)),
      );
    } catch (err) {
      list.replaceChildren(message("error", errorText(err)));
    }
  };
  const act = (verb: string, fn: () => Promise<unknown>) => actions(rowOut, load)(async () => {
    await fn();
    return verb;
  });
  const endpointRow = (e: WebhookEndpoint) =>
    row(
      h("span", { class: "mono" }, e.url),
      e.events.join(", "),
      e.description,
      e.enabled ? "enabled" : "disabled",
      when(e.createdAt),
      h(
        "div",
        { class: "actions" },
        button("Deliveries", () => void showLog(e), { class: "secondary", "aria-label": `Deliveries of ${e.url}` }),
        e.enabled
          ? button("Disable", act(`Disabled ${e.url}`, () => webhooks.updateWebhookEndpoint({ id: e.id, enabled: false })), { class: "secondary", "aria-label": `Disable ${e.url}` })
          : button("Enable", act(`Enabled ${e.url}`, () => webhooks.updateWebhookEndpoint({ id: e.id, enabled: true })), { class: "secondary", "aria-label": `Enable ${e.url}` }),
        confirmButton("Rotate secret", "Confirm rotate", async () => {
          try {
            const res = await webhooks.rotateWebhookSecret({ id: e.id });
            out.replaceChildren(secretPanel(res.secret, e.url, "The previous secret also signs deliveries for 24 hours."));
          } catch (err) {
            rowOut.replaceChildren(message("error", errorText(err)));
          }
        }, `Rotate the secret of ${e.url}`),
        confirmButton("Delete", "Confirm delete", act(`Deleted ${e.url}`, () => webhooks.deleteWebhookEndpoint({ id: e.id })), `Delete ${e.url}`),
      ),
    );

  const showLog = async (e: WebhookEndpoint) => {
    const logOut = h("div", { class: "out" });
    const render = async () => {
      try {
        const res = await webhooks.listWebhookDeliveries({ endpointId: e.id, pageSize: 50 });
        log.replaceChildren(
          h("h2", {}, `Deliveries to ${e.url}`),
          logOut,
          res.deliveries.length === 0
            ? message("note", "No deliveries yet.")
            : table("Deliveries", ["Event", "Status", "Attempts", "Last answer", "Last error", "Next attempt", "Created", ""], res.deliveries.map((d) => deliveryRow(d, logOut, render))),
        );
      } catch (err) {
        log.replaceChildren(message("error", errorText(err)));
      }
    };
    await render();
    // The log is below the endpoints: bring it into view, or the button
    // seems to do nothing.
    log.scrollIntoView({ block: "start" });
  };
  const deliveryRow = (d: WebhookDelivery, logOut: HTMLElement, reload: () => Promise<void>) =>
    row(
      d.eventType,
      d.status,
      String(d.attempts),
      d.lastStatusCode ? String(d.lastStatusCode) : "—",
      d.lastError,
      d.status === "pending" ? when(d.nextAttemptAt) : "—",
      when(d.createdAt),
      button("Redeliver", actions(logOut, reload)(async () => {
        await webhooks.redeliverWebhook({ id: d.id });
        return `Queued ${d.id} again`;
      }), { class: "secondary", "aria-label": `Redeliver ${d.id}` }),
    );

  const url = rule(input({ name: "url", type: "url", required: true, autocomplete: "off", spellcheck: "false", placeholder: "https://hooks.example.com/cohort" }), required("url"), maxRunes("url", 2048));
  const description = rule(input({ name: "description", autocomplete: "off" }), maxRunes("description", 500), noControl("description"));
  const boxes = EVENTS.map((ev) => input({ type: "checkbox", name: "events", value: ev, checked: true, id: `ev-${ev}` }));
  const eventsErr = h("p", { class: "field-error", "aria-live": "polite" });
  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (ev: Event) => {
        ev.preventDefault();
        eventsErr.textContent = "";
        if (!validate(ev.target as HTMLElement)) return;
        const events = boxes.filter((b) => b.checked).map((b) => b.value);
        if (events.length === 0) {
          eventsErr.textContent = "choose at least one event";
          return;
        }
        try {
          const res = await webhooks.createWebhookEndpoint({ workspaceId: ws.value, url: url.value, events, description: description.value });
          out.replaceChildren(secretPanel(res.secret, res.endpoint?.url ?? "", "Give it to the receiver: it verifies every delivery's signature with it."));
          url.value = "";
          description.value = "";
          await load();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("URL", url, "https://, or http:// to a private receiver the operator allows (--webhook-allow-hosts)."),
    h("fieldset", {}, h("legend", {}, "Events"), ...boxes.map((b) => h("label", {}, b, ` ${b.value}`)), eventsErr),
    field("Description", description, "Optional; up to 500 characters."),
    h("button", { type: "submit" }, "Create endpoint"),
  );
  ws.addEventListener("change", () => {
    log.replaceChildren();
    void load();
  });
  root.append(
    h("h1", { tabindex: "-1" }, "Webhooks"),
    h("p", { class: "hint" }, "Signed POSTs (Standard Webhooks) when a run pauses, completes, fails or is cancelled."),
    field("Workspace", ws),
    loadOut,
    rowOut,
    list,
    out,
    h("h2", {}, "Add an endpoint"),
    form,
    log,
  );
  await load();
}

// secretPanel shows a signing secret once, with a copy button; nothing
// keeps it once the panel is dismissed.
function secretPanel(secret: string, url: string, note: string): HTMLElement {
  const box = input({ readonly: true, class: "mono", id: "new-secret", spellcheck: "false", autocomplete: "off" });
  box.value = secret;
  const status = h("span", { role: "status", class: "hint" });
  const panel = h(
    "section",
    { class: "once", "aria-labelledby": "secret-title" },
    h("h3", { id: "secret-title" }, `Signing secret of ${url}`),
    h("p", { role: "alert" }, `Copy it now: this is the only time it is shown. ${note}`),
    field("Secret", box),
    h(
      "div",
      { class: "actions" },
      button("Copy", async () => {
        try {
          await navigator.clipboard.writeText(box.value);
          status.textContent = "Copied.";
        } catch {
          box.select();
          status.textContent = document.execCommand("copy") ? "Copied." : "Copy failed: select the secret and copy it by hand.";
        }
      }),
      button("I have stored it", () => panel.remove(), { class: "secondary" }),
      status,
    ),
  );
  return panel;
}
