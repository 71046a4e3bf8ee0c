import type { TextCheck } from "./job_view.js";
import { webCrypto } from "./web_crypto.js";

/**
 * Whether `text` is the text the job's end describes (its UTF-8 bytes and their SHA-1);
 * `null` where SHA-1 cannot be computed (a page that is not a secure context).
 */
export async function textMatches(text: string, check: TextCheck): Promise<boolean | null> {
  const bytes = new TextEncoder().encode(text);
  if (bytes.length !== check.bytes) return false;
  const subtle = (await webCrypto())?.subtle;
  if (subtle === undefined) return null;
  const digest = new Uint8Array(await subtle.digest("SHA-1", bytes));
  return hex(digest) === check.sha1;
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
