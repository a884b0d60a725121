// Workspaces: the list the key can see, and creation with every field of the
// spec's create request, validated here as the service validates it.
import { workspaces, admin, errorText, keyKind, lacksManagement } from "../api";
import type { Workspace } from "../gen/cohort/v1/workspace_pb";
import {
  h, message, field, input, select, textarea, option, rule, validate, table, row, when,
  required, maxRunes, noControl, pattern,
  managementNote,
} from "../dom";

const SORTS = ["price", "throughput", "latency", "exacto"];
const MAX_LOGGING_KEYS = 100;

export async function workspacesPage(root: HTMLElement): Promise<void> {
  const list = h("div");
  const out = h("div", { class: "out" });

  const name = rule(input({ name: "name", required: true, autocomplete: "off" }), required("name"), maxRunes("name", 100), noControl("name"));
  const slug = rule(
    input({ name: "slug", autocomplete: "off", pattern: "[a-z0-9]+(?:-[a-z0-9]+)*", spellcheck: "false" }),
    maxRunes("slug", 50),
    pattern("slug must be lowercase letters and digits in segments separated by single hyphens, with no leading or trailing hyphen"),
  );
  const description = rule(textarea({ name: "description", rows: "3" }), maxRunes("description", 500), noControl("description", true));
  const textModel = rule(input({ name: "default_text_model", autocomplete: "off", spellcheck: "false" }), maxRunes("default_text_model", 256), noControl("default_text_model"));
  const imageModel = rule(input({ name: "default_image_model", autocomplete: "off", spellcheck: "false" }), maxRunes("default_image_model", 256), noControl("default_image_model"));
  const sort = select({ name: "default_provider_sort" }, option("", "Service default (price)"), ...SORTS.map((s) => option(s)));
  const rate = rule(input({ name: "io_logging_sampling_rate", type: "text", inputmode: "decimal", placeholder: "1", autocomplete: "off" }), (v) => {
    const n = Number(v);
    return v.trim() === "" || (n >= 0.0001 && n <= 1) ? "" : "io_logging_sampling_rate must be between 0.0001 and 1";
  });
  const discount = input({ type: "checkbox", name: "is_data_discount_logging_enabled" });
  const broadcast = input({ type: "checkbox", name: "is_observability_broadcast_enabled" });
  const ioLogging = input({ type: "checkbox", name: "is_observability_io_logging_enabled" });

  // io_logging_api_key_ids: null (no filter) or a list, possibly empty.
  const filter = input({ type: "checkbox", name: "filter_keys" });
  const keyBoxes = h("div", { class: "checks", role: "group", "aria-label": "API keys whose I/O is logged" });
  const keyErr = h("p", { class: "field-error", "aria-live": "polite" });
  const keysBlock = h("fieldset", { hidden: true }, h("legend", {}, "API keys whose I/O is logged"), keyBoxes, keyErr);
  filter.addEventListener("change", () => (keysBlock.hidden = !filter.checked));
  const loadKeys = async () => {
    try {
      const res = await admin.listApiKeys({});
      keyBoxes.replaceChildren(
        ...(res.apiKeys.length ? res.apiKeys : []).map((k) =>
          field(`${k.name} (${k.kind}, ${k.prefix}…)`, input({ type: "checkbox", name: "io_key", value: k.id })),
        ),
      );
      if (res.apiKeys.length === 0) keyBoxes.append(h("p", {}, "No keys: the filter will be an empty list."));
    } catch (err) {
      keyBoxes.replaceChildren(message("error", errorText(err)));
    }
  };

  const load = async () => {
    try {
      const res = await workspaces.listWorkspaces({});
      list.replaceChildren(
        table(
          "Workspaces",
          ["Name", "Slug", "Id", "Created"],
          res.data.map((w) => row(w.name, w.slug, h("span", { class: "mono" }, w.id), when(w.createdAt))),
        ),
      );
    } catch (err) {
      list.replaceChildren(message("error", errorText(err)));
    }
  };

  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const f = e.target as HTMLFormElement;
        keyErr.textContent = "";
        if (!validate(f)) return;
        const ids = [...keyBoxes.querySelectorAll<HTMLInputElement>("input:checked")].map((c) => c.value);
        if (filter.checked && ids.length > MAX_LOGGING_KEYS) {
          keyErr.textContent = `io_logging_api_key_ids may hold at most ${MAX_LOGGING_KEYS} ids`;
          return;
        }
        try {
          const res = await workspaces.createWorkspace({
            name: name.value,
            slug: slug.value || undefined,
            description: description.value || undefined,
            defaultTextModel: textModel.value || undefined,
            defaultImageModel: imageModel.value || undefined,
            defaultProviderSort: sort.value || undefined,
            ioLoggingApiKeyIds: filter.checked ? { ids } : undefined,
            ioLoggingSamplingRate: rate.value.trim() === "" ? undefined : Number(rate.value),
            isDataDiscountLoggingEnabled: discount.checked,
            isObservabilityBroadcastEnabled: broadcast.checked,
            isObservabilityIoLoggingEnabled: ioLogging.checked,
          });
          out.replaceChildren(message("ok", `Created ${res.data?.slug}`), res.data ? details(res.data) : "");
          f.reset();
          keysBlock.hidden = true;
          await load();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Name", name, "1 to 100 characters."),
    field("Slug", slug, "Optional; derived from the name when empty. Lowercase letters and digits, single hyphens; up to 50."),
    field("Description", description, "Up to 500 characters."),
    field("Default text model", textModel, "A model slug."),
    field("Default image model", imageModel, "A model slug."),
    field("Default provider sort", sort),
    field("I/O logging sampling rate", rate, "0.0001 to 1; empty means 1."),
    field("Data discount logging", discount),
    field("Observability broadcast", broadcast),
    field("Private I/O logging (observability)", ioLogging),
    field("Log I/O only for chosen API keys", filter, "Unchecked: no filter (null). Checked with none chosen: an empty list."),
    keysBlock,
    h("button", { type: "submit" }, "Create workspace"),
    out,
  );
  if (lacksManagement()) {
    root.append(h("h1", { tabindex: "-1" }, "Workspaces"), list, managementNote("Creating a workspace", keyKind()));
    await load();
    return;
  }
  root.append(h("h1", { tabindex: "-1" }, "Workspaces"), list, h("h2", {}, "Create a workspace"), h("p", { class: "hint" }, "Needs a management key."), form);
  await Promise.all([load(), loadKeys()]);
}

// details shows the created record, every field the API returned.
function details(w: Workspace): HTMLElement {
  const ids = w.ioLoggingApiKeyIds ? `[${w.ioLoggingApiKeyIds.ids.join(", ")}]` : "null";
  const rows: [string, string][] = [
    ["id", w.id], ["name", w.name], ["slug", w.slug], ["description", w.description],
    ["default_text_model", w.defaultTextModel], ["default_image_model", w.defaultImageModel],
    ["default_provider_sort", w.defaultProviderSort], ["default_guardrail_id", w.defaultGuardrailId ?? "null"],
    ["io_logging_api_key_ids", ids], ["io_logging_sampling_rate", String(w.ioLoggingSamplingRate)],
    ["is_data_discount_logging_enabled", String(w.isDataDiscountLoggingEnabled)],
    ["is_observability_broadcast_enabled", String(w.isObservabilityBroadcastEnabled)],
    ["is_observability_io_logging_enabled", String(w.isObservabilityIoLoggingEnabled)],
    ["created_at", when(w.createdAt)], ["created_by", w.createdBy], ["updated_at", w.updatedAt ? when(w.updatedAt) : "null"],
  ];
  return h("dl", { class: "record" }, ...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { class: "mono" }, v)]));
}
