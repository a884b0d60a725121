// A Cohort webhook receiver in TypeScript on Node's standard library: it
// checks each delivery's Standard Webhooks signature and age, then prints
// the event. Compile and run:
//
//   tsc --target es2022 --module nodenext --outDir out receiver.ts   (with @types/node)
//   WEBHOOK_SECRET=whsec_… node out/receiver.js
//
// Without a project: npx -p typescript tsc --noCheck … compiles it as is.
//
// It listens on $LISTEN (default 127.0.0.1:8001) and answers 204 to a
// verified delivery, 401 to anything else.
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingHttpHeaders } from "node:http";

const toleranceSeconds = 5 * 60;

function header(h: IncomingHttpHeaders, name: string): string {
  const v = h[name];
  return Array.isArray(v) ? v[0] : (v ?? "");
}

// verify checks webhook-signature: HMAC-SHA256 over "id.timestamp.body"
// with the secret's base64 key, any of the space-separated "v1,…" entries
// (two during a secret rotation).
export function verify(secret: string, h: IncomingHttpHeaders, body: Buffer, nowSeconds: number): string | null {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const id = header(h, "webhook-id");
  const ts = header(h, "webhook-timestamp");
  if (!id || !/^\d+$/.test(ts)) return "missing webhook-id or webhook-timestamp";
  if (Math.abs(nowSeconds - Number(ts)) > toleranceSeconds) return "timestamp outside the tolerance";
  const want = createHmac("sha256", key).update(`${id}.${ts}.`).update(body).digest();
  for (const sig of header(h, "webhook-signature").split(" ")) {
    const [version, b64] = sig.split(",", 2);
    if (version !== "v1" || !b64) continue;
    const got = Buffer.from(b64, "base64");
    if (got.length === want.length && timingSafeEqual(got, want)) return null;
  }
  return "no valid signature";
}

const secret = process.env.WEBHOOK_SECRET ?? "";
if (!secret) {
  console.error("set WEBHOOK_SECRET to the endpoint's secret (whsec_…)");
  process.exit(1);
}
const [host, port] = (process.env.LISTEN ?? "127.0.0.1:8001").split(":");

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const err = req.method === "POST" ? verify(secret, req.headers, body, Math.floor(Date.now() / 1000)) : "POST only";
    if (err) {
      res.writeHead(401, { "Content-Type": "text/plain" }).end(err);
      return;
    }
    const event = JSON.parse(body.toString("utf8"));
    // webhook-id is the same on every retry: dedupe on it to act once.
    // event.data is the run object as GET …/runs/{id} returns it: on run.paused,
    // answer event.data.pending_interaction.id (the tool_call_id) in
    // event.data.session_id, on POST /api/v1/interns/{event.data.intern_id}/chat/completions.
    console.log(header(req.headers, "webhook-id"), event.type, JSON.stringify(event.data));
    res.writeHead(204).end();
  });
});
server.listen(Number(port), host, () => {
  const a = server.address();
  console.log(`listening on http://${host}:${typeof a === "object" && a ? a.port : port}`);
});
