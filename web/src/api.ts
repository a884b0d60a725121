// The console talks to the service only through the generated Connect
// clients. The API key lives in sessionStorage: never localStorage, never a URL.
import { createClient, type Interceptor, ConnectError } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { WorkspaceService } from "./gen/cohort/v1/workspace_pb";
import { AdminService } from "./gen/cohort/v1/admin_pb";
import { InternService } from "./gen/cohort/v1/intern_pb";
import { VaultService, VaultAdminService } from "./gen/cohort/v1/vault_pb";
import { ChatService } from "./gen/cohort/v1/chat_pb";
import { FederationService } from "./gen/cohort/v1/federation_pb";
import { WebhookService } from "./gen/cohort/v1/webhook_pb";
import { RunService } from "./gen/cohort/v1/run_pb";
import { ErrorDetailSchema } from "./gen/cohort/v1/errors_pb";

const KEY = "cohort.apiKey";

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function signIn(key: string): void {
  sessionStorage.setItem(KEY, key.trim());
}

export function signOut(): void {
  sessionStorage.removeItem(KEY);
}

// keyKind names the kind of the signed-in key from its public prefix (the
// console never shows the key itself).
export function keyKind(): string {
  const k = apiKey() ?? "";
  if (k.startsWith("cohort_mk_")) return "management";
  if (k.startsWith("cohort_wk_")) return "workspace";
  if (k.startsWith("cohort_pk_")) return "personal";
  return "unknown";
}

// lacksManagement: the signed-in key is known (by its prefix) not to be a
// management key, so management-only forms would only be refused. An
// unrecognised key (an exchanged access token) is left to the API to judge.
export function lacksManagement(): boolean {
  const k = keyKind();
  return k === "workspace" || k === "personal";
}

const bearer: Interceptor = (next) => async (req) => {
  const k = apiKey();
  if (k) req.header.set("Authorization", `Bearer ${k}`);
  return next(req);
};

export const transport = createConnectTransport({
  baseUrl: `${location.origin}/api/v1`,
  interceptors: [bearer],
});

export const workspaces = createClient(WorkspaceService, transport);
export const admin = createClient(AdminService, transport);
export const interns = createClient(InternService, transport);
export const vault = createClient(VaultService, transport);
export const vaultAdmin = createClient(VaultAdminService, transport);
export const chat = createClient(ChatService, transport);
export const federation = createClient(FederationService, transport);
export const webhooks = createClient(WebhookService, transport);
export const runs = createClient(RunService, transport);

// errorText shows an error as the API words it.
export function errorText(err: unknown): string {
  if (err instanceof ConnectError) return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}

// errorReason is the spec's reason carried by the error's detail, if any.
export function errorReason(err: unknown): string {
  if (!(err instanceof ConnectError)) return "";
  return err.findDetails(ErrorDetailSchema)[0]?.reason ?? "";
}
