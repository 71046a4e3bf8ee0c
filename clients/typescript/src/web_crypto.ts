/**
 * Web Crypto: the browser's (and Node 20's) global, else Node 18's, which only `node:crypto`
 * exports (the module is named through a variable, so a browser bundle leaves it alone).
 */
export async function webCrypto(): Promise<Crypto | undefined> {
  if (globalThis.crypto !== undefined) return globalThis.crypto;
  const nodeCrypto = "node:crypto";
  try {
    const module = (await import(nodeCrypto)) as { webcrypto?: Crypto };
    return module.webcrypto;
  } catch {
    return undefined;
  }
}
