// @vercel/oidc's browser entry (dist/index-browser.js) as an ES module: the package ships
// CommonJS only, which a bundler would convert. `ai`'s gateway provider imports it; the chat
// never calls it.
const SYMBOL_FOR_REQ_CONTEXT = Symbol.for("@vercel/request-context");

export function getContext() {
  return globalThis[SYMBOL_FOR_REQ_CONTEXT]?.get?.() ?? {};
}

export async function getVercelOidcToken() {
  return "";
}
