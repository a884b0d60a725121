// Cohort's API as typed Connect clients: every public service over one
// base URL and one credential (an API key or a federation access token),
// sent on unary calls and streams alike. connect-web's transport uses
// fetch, so the same code runs in browsers and in Node 18 or later.
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AdminService } from "./gen/cohort/v1/admin_pb.js";
import { ChatService } from "./gen/cohort/v1/chat_pb.js";
import { FederationService } from "./gen/cohort/v1/federation_pb.js";
import { InternService } from "./gen/cohort/v1/intern_pb.js";
import { RunService } from "./gen/cohort/v1/run_pb.js";
import { VaultAdminService, VaultService } from "./gen/cohort/v1/vault_pb.js";
import { WebhookService } from "./gen/cohort/v1/webhook_pb.js";
import { WorkspaceService } from "./gen/cohort/v1/workspace_pb.js";

// The errors this package's calls throw are this copy's: take Code and
// ConnectError from here (ConnectError.from(e).code).
export { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
export * from "./gen/cohort/v1/admin_pb.js";
export * from "./gen/cohort/v1/chat_pb.js";
export * from "./gen/cohort/v1/errors_pb.js";
export * from "./gen/cohort/v1/federation_pb.js";
export * from "./gen/cohort/v1/intern_pb.js";
export * from "./gen/cohort/v1/run_pb.js";
export * from "./gen/cohort/v1/vault_pb.js";
export * from "./gen/cohort/v1/webhook_pb.js";
export * from "./gen/cohort/v1/workspace_pb.js";

/** bearer puts `Authorization: Bearer <key>` on every call. */
export function bearer(key: string): Interceptor {
  return (next) => (req) => {
    req.header.set("Authorization", `Bearer ${key}`);
    return next(req);
  };
}

export interface CohortClient {
  workspaces: Client<typeof WorkspaceService>;
  interns: Client<typeof InternService>;
  chat: Client<typeof ChatService>;
  runs: Client<typeof RunService>;
  vault: Client<typeof VaultService>;
  vaultAdmin: Client<typeof VaultAdminService>;
  federation: Client<typeof FederationService>;
  webhooks: Client<typeof WebhookService>;
  admin: Client<typeof AdminService>;
  transport: Transport;
}

/**
 * createCohortClient returns a client of every service of the API at
 * baseUrl (the gateway's address with /api/v1) presenting key.
 */
export function createCohortClient(baseUrl: string, key: string, options: { fetch?: typeof globalThis.fetch } = {}): CohortClient {
  const transport = createConnectTransport({ baseUrl, interceptors: [bearer(key)], fetch: options.fetch });
  return {
    workspaces: createClient(WorkspaceService, transport),
    interns: createClient(InternService, transport),
    chat: createClient(ChatService, transport),
    runs: createClient(RunService, transport),
    vault: createClient(VaultService, transport),
    vaultAdmin: createClient(VaultAdminService, transport),
    federation: createClient(FederationService, transport),
    webhooks: createClient(WebhookService, transport),
    admin: createClient(AdminService, transport),
    transport,
  };
}
