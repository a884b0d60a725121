import { apiKey, signIn, signOut, workspaces, errorText } from "./api";
import { h, message, field } from "./dom";
import { timestampDate } from "@bufbuild/protobuf/wkt";

const app = document.getElementById("app")!;
const nav = document.getElementById("nav")!;

type Page = (root: HTMLElement) => Promise<void> | void;

const pages: Record<string, Page> = {
  "/": signInPage,
  "/workspaces": workspacesPage,
};

function render(): void {
  const path = location.hash.replace(/^#/, "") || "/";
  nav.replaceChildren(
    ...(apiKey()
      ? [h("a", { href: "#/workspaces" }, "Workspaces"), h("a", { href: "#/", onclick: () => signOut() }, "Sign out")]
      : []),
  );
  const page = apiKey() ? pages[path] ?? signInPage : signInPage;
  app.replaceChildren();
  void page(app);
  app.focus();
}

function signInPage(root: HTMLElement): void {
  const key = h("input", { type: "password", name: "key", autocomplete: "off", required: true, id: "key" }) as HTMLInputElement;
  const out = h("div");
  const form = h(
    "form",
    {
      onsubmit: async (e: Event) => {
        e.preventDefault();
        signIn(key.value);
        try {
          await workspaces.listWorkspaces({});
          location.hash = "#/workspaces";
          render();
        } catch (err) {
          signOut();
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("API key", key),
    h("button", { type: "submit" }, "Sign in"),
    out,
  );
  root.append(h("h1", {}, "Sign in"), h("p", {}, "The key stays in this tab's session storage."), form);
}

async function workspacesPage(root: HTMLElement): Promise<void> {
  const list = h("div");
  const out = h("div");
  const name = h("input", { name: "name", required: true, maxlength: "100" }) as HTMLInputElement;
  const slug = h("input", { name: "slug", maxlength: "50", pattern: "[a-z0-9]+(-[a-z0-9]+)*" }) as HTMLInputElement;
  const description = h("textarea", { name: "description", maxlength: "500" }) as HTMLTextAreaElement;
  const load = async () => {
    try {
      const res = await workspaces.listWorkspaces({});
      list.replaceChildren(
        h(
          "table",
          {},
          h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Slug"), h("th", {}, "Id"), h("th", {}, "Created"))),
          h(
            "tbody",
            {},
            ...res.data.map((w) =>
              h(
                "tr",
                {},
                h("td", {}, w.name),
                h("td", {}, w.slug),
                h("td", { class: "mono" }, w.id),
                h("td", {}, w.createdAt ? timestampDate(w.createdAt).toLocaleString() : ""),
              ),
            ),
          ),
        ),
      );
    } catch (err) {
      list.replaceChildren(message("error", errorText(err)));
    }
  };
  const form = h(
    "form",
    {
      onsubmit: async (e: Event) => {
        e.preventDefault();
        try {
          const res = await workspaces.createWorkspace({
            name: name.value,
            slug: slug.value || undefined,
            description: description.value || undefined,
          });
          out.replaceChildren(message("ok", `Created ${res.data?.slug}`));
          (e.target as HTMLFormElement).reset();
          await load();
        } catch (err) {
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("Name", name),
    field("Slug (optional)", slug),
    field("Description", description),
    h("button", { type: "submit" }, "Create workspace"),
    out,
  );
  root.append(h("h1", {}, "Workspaces"), list, h("h2", {}, "Create a workspace"), form);
  await load();
}

window.addEventListener("hashchange", render);
render();
