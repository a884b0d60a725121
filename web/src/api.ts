// The console talks to the service only through the generated Connect
// clients. The API key lives in sessionStorage: never localStorage, never a URL.
import { createClient, type Interceptor, ConnectError } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { WorkspaceService } from "./gen/cohort/v1/workspace_pb";
import { AdminService } from "./gen/cohort/v1/admin_pb";
import { InternService } from "./gen/cohort/v1/intern_pb";

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

// errorText shows an error as the API words it.
export function errorText(err: unknown): string {
  if (err instanceof ConnectError) return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}
