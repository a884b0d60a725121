// The shim cohort-bench e2e loads into the peer gateway (node --import).
// @portkey-ai/gateway 1.15.2 appends its x-portkey-* headers to the
// upstream's fetch Response itself; under Node 20 (undici) those headers
// are immutable, so every request fails with "TypeError: immutable" (500).
// Wrapping each fetch Response in a new one with a copy of its headers
// makes them mutable; the body stream is passed on as is, unread.
const upstreamFetch = globalThis.fetch;
globalThis.fetch = async (...args) => {
  const res = await upstreamFetch(...args);
  return new Response(res.body, { status: res.status, statusText: res.statusText, headers: new Headers(res.headers) });
};
