import { apiKey, signIn, signOut, workspaces, errorText, keyKind, lacksManagement } from "./api";
import { h, message, field, input, leave, onLeave } from "./dom";
import { workspacesPage } from "./pages/workspaces";
import { keysPage } from "./pages/keys";
import { internsPage } from "./pages/interns";
import { vaultPage } from "./pages/vault";
import { chatPage } from "./pages/chat";
import { federationPage } from "./pages/federation";
import { webhooksPage } from "./pages/webhooks";
import { runsPage } from "./pages/runs";

const app = document.getElementById("app")!;
const nav = document.getElementById("nav")!;

// A page renders into root; arg is the rest of the route (an id, or ids
// joined by "/").
type Page = (root: HTMLElement, arg: string) => Promise<void> | void;

// Pages only a management key can use: left out of a workspace or
// personal key's navigation (their routes still explain why).
const managementOnly = new Set(["keys", "federation"]);

const pages: Record<string, [string, Page]> = {
  workspaces: ["Workspaces", workspacesPage],
  keys: ["API keys", keysPage],
  interns: ["Interns", internsPage],
  chat: ["Playground", chatPage],
  runs: ["Runs", runsPage],
  vault: ["Vault", vaultPage],
  federation: ["Workload identity", federationPage],
  webhooks: ["Webhooks", webhooksPage],
};

function render(): void {
  leave();
  const [name = "", ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const arg = rest.join("/");
  const signedIn = apiKey() !== null;
  const entry = signedIn ? pages[name] : undefined;
  nav.replaceChildren(
    ...(signedIn
      ? [
          ...Object.entries(pages)
            .filter(([k]) => !(lacksManagement() && managementOnly.has(k)))
            .map(([k, [label]]) => h("a", { href: `#/${k}`, "aria-current": k === name ? "page" : undefined }, label)),
          h("span", { class: "who" }, `${keyKind()} key`),
          h("button", { type: "button", class: "link", onclick: () => { signOut(); location.hash = "#/"; render(); } }, "Sign out"),
        ]
      : []),
  );
  app.replaceChildren();
  document.title = `${entry ? entry[0] : "Sign in"} · Cohort console`;
  void Promise.resolve((entry ? entry[1] : signInPage)(app, decodeURIComponent(arg)));
  // Move focus to the new page's heading, so keyboard and screen reader
  // users start there; pages that load data first add it a moment later.
  const focusHeading = () => {
    const h1 = app.querySelector("h1");
    h1?.focus();
    return h1 !== null;
  };
  if (!focusHeading()) {
    const mo = new MutationObserver(() => focusHeading() && mo.disconnect());
    mo.observe(app, { childList: true, subtree: true });
    onLeave(() => mo.disconnect());
  }
}

function signInPage(root: HTMLElement): void {
  if (apiKey()) {
    location.hash = "#/workspaces";
    return;
  }
  const key = input({ type: "password", name: "key", autocomplete: "off", required: true, id: "key", spellcheck: "false" });
  const out = h("div");
  const form = h(
    "form",
    {
      onsubmit: async (e: Event) => {
        e.preventDefault();
        signIn(key.value);
        try {
          await workspaces.listWorkspaces({});
          key.value = "";
          location.hash = "#/workspaces";
          render();
        } catch (err) {
          signOut();
          out.replaceChildren(message("error", errorText(err)));
        }
      },
    },
    field("API key", key, "Management keys administer the organization; workspace keys chat and store secrets."),
    h("button", { type: "submit" }, "Sign in"),
    out,
  );
  root.append(h("h1", { tabindex: "-1" }, "Sign in"), h("p", {}, "The key stays in this tab's session storage."), form);
}

window.addEventListener("hashchange", render);
render();
