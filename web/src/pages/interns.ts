// Interns: per workspace, list with state, create with a model and an
// agent, change either, suspend, resume, delete; links to the playground and
// the vault.
import { interns, errorText } from "../api";
import type { Intern } from "../gen/cohort/v1/intern_pb";
import { h, message, field, input, button, rule, validate, table, row, when, required, maxRunes, confirmButton, actions } from "../dom";
import { workspaceSelect } from "../pickers";

// fit marks a table whose ids and actions wrap to keep every column in view.
const fit = (el: HTMLElement) => (el.classList.add("fit"), el);

export async function internsPage(root: HTMLElement, wsArg: string): Promise<void> {
  const list = h("div");
  const out = h("div", { class: "out" });
  const rowOut = h("div", { class: "out" });
  const ws = await workspaceSelect({ name: "workspace", id: "intern-ws" }, out);
  if (wsArg) ws.value = wsArg;

  const load = async () => {
    if (!ws.value) {
      list.replaceChildren(message("note", "No workspace to list."));
      return;
    }
    try {
      const res = await interns.listInterns({ workspaceId: ws.value });
      list.replaceChildren(
        res.interns.length
          ? fit(table("Interns", ["Name", "Model", "Agent", "State", "Id", "Created", "Actions"], res.interns.map(internRow)))
          : message("note", "No interns in this workspace yet."),
      );
    } catch (err) {
      list.replaceChildren(message("error", errorText(err)));
    }
  };
  const act = (verb: string, fn: () => Promise<{ intern?: Intern }>) => actions(rowOut, load)(async () => {
    const res = await fn();
    return `${verb}: ${res.intern?.name} is ${res.intern?.state}`;
  });
  const internRow = (i: Intern) => {
    const model = rule(input({ value: i.model, "aria-label": `Model of ${i.name}`, class: "inline", spellcheck: "false" }), required("model"), maxRunes("model", 256));
    const edit = h(
      "form",
      {
        class: "inline",
        novalidate: true,
        onsubmit: (e: Event) => {
          e.preventDefault();
          if (validate(e.target as HTMLElement)) void act("Model changed", () => interns.updateIntern({ id: i.id, model: model.value }))();
        },
      },
      model,
      h("button", { type: "submit", class: "secondary", "aria-label": `Save the model of ${i.name}` }, "Save"),
    );
    // The gateway's catalog decides which names are allowed; its refusal
    // lists them.
    const agent = rule(input({ value: i.agent, "aria-label": `Agent of ${i.name}`, class: "inline", spellcheck: "false" }), required("agent"), maxRunes("agent", 32));
    const editAgent = h(
      "form",
      {
        class: "inline",
        novalidate: true,
        onsubmit: (e: Event) => {
          e.preventDefault();
          if (validate(e.target as HTMLElement)) void act("Agent changed", () => interns.updateIntern({ id: i.id, agent: agent.value }))();
        },
      },
      agent,
      h("button", { type: "submit", class: "secondary", "aria-label": `Save the agent of ${i.name}` }, "Save"),
    );
    const live = i.state !== "deleted";
    return row(
      i.name,
      edit,
      editAgent,
      h("span", { class: `state state-${i.state}` }, i.state),
      h("span", { class: "mono" }, i.id),
      when(i.createdAt),
      h(
        "div",
        { class: "actions" },
        i.state === "running" || i.state === "sleeping" ? h("a", { href: `#/chat/${i.id}`, class: "button" }, "Chat") : null,
        h("a", { href: `#/runs/${i.id}`, class: "button secondary" }, "Runs"),
        h("a", { href: `#/vault/${i.id}`, class: "button secondary" }, "Secrets"),
        i.state === "suspended"
          ? button("Resume", act("Resumed", () => interns.resumeIntern({ id: i.id })), { class: "secondary", "aria-label": `Resume ${i.name}` })
          : live
            ? button("Suspend", act("Suspended", () => interns.suspendIntern({ id: i.id })), { class: "secondary", "aria-label": `Suspend ${i.name}` })
            : null,
        confirmButton("Delete", "Confirm delete", act("Deleted", () => interns.deleteIntern({ id: i.id })), `Delete ${i.name}`),
      ),
    );
  };

  const name = rule(input({ name: "intern_name", required: true, autocomplete: "off" }), required("name"), maxRunes("name", 100));
  const model = rule(input({ name: "model", value: "cohort/demo", required: true, spellcheck: "false" }), required("model"), maxRunes("model", 256));
  const agent = rule(input({ name: "agent", value: "cohort", required: true, spellcheck: "false" }), required("agent"), maxRunes("agent", 32));
  const form = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (!validate(e.target as HTMLElement)) return;
        try {
          const res = await interns.createIntern({ workspaceId: ws.value, name: name.value, model: model.value, agent: agent.value });
          out.replaceChildren(message("ok", `Created ${res.intern?.name} (${res.intern?.state})`));
          name.value = "";
          await load();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Name", name, "1 to 100 characters."),
    field("Model", model, "The model the intern runs, for example cohort/demo."),
    field("Agent", agent, "cohort (built in), or an agent this gateway allows: claude, codex, opencode, gemini when installed."),
    h("button", { type: "submit" }, "Create intern"),
  );
  ws.addEventListener("change", () => void load());
  root.append(
    h("h1", { tabindex: "-1" }, "Interns"),
    h("div", { class: "toolbar" }, field("Workspace", ws), button("Refresh", () => void load(), { class: "secondary" })),
    rowOut,
    list,
    h("h2", {}, "Create an intern"),
    form,
    out,
  );
  await load();
}
