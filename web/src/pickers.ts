// Selects filled from the API: the workspaces the key can see, and the
// interns in them. Both show the API's refusal in place of the options.
import { workspaces, interns, errorText } from "./api";
import type { Workspace } from "./gen/cohort/v1/workspace_pb";
import type { Intern } from "./gen/cohort/v1/intern_pb";
import { h, option, select, message } from "./dom";

export async function listWorkspaces(): Promise<Workspace[]> {
  return (await workspaces.listWorkspaces({})).data;
}

// workspaceSelect lists the visible workspaces; out receives a load error.
export async function workspaceSelect(attrs: Record<string, string | boolean>, out: HTMLElement, blank?: string): Promise<HTMLSelectElement> {
  const sel = select(attrs);
  if (blank !== undefined) sel.append(option("", blank));
  try {
    for (const w of await listWorkspaces()) sel.append(option(w.id, `${w.name} (${w.slug})`));
  } catch (err) {
    out.replaceChildren(message("error", errorText(err)));
  }
  return sel;
}

// allInterns lists live interns of every visible workspace (a management key
// must name the workspace, so the console asks once per workspace).
export async function allInterns(): Promise<{ ws: Workspace; interns: Intern[] }[]> {
  const wss = await listWorkspaces();
  return Promise.all(wss.map(async (ws) => ({ ws, interns: (await interns.listInterns({ workspaceId: ws.id })).interns })));
}

// internSelect offers every intern, grouped by workspace, preselecting id.
// A required select with no id and a single intern to offer preselects that
// intern: there is nothing to choose, so the form must not refuse for it.
export async function internSelect(attrs: Record<string, string | boolean>, id: string, out: HTMLElement): Promise<HTMLSelectElement> {
  const sel = select(attrs, option("", "Choose an intern"));
  try {
    const groups = await allInterns();
    const all = groups.flatMap((g) => g.interns);
    if (!id && attrs.required && all.length === 1) id = all[0].id;
    for (const g of groups) {
      if (g.interns.length === 0) continue;
      sel.append(h("optgroup", { label: g.ws.name }, ...g.interns.map((i) => option(i.id, `${i.name} (${i.state})`, i.id === id))));
    }
  } catch (err) {
    out.replaceChildren(message("error", errorText(err)));
  }
  if (id && sel.value !== id) sel.append(option(id, id, true));
  return sel;
}
