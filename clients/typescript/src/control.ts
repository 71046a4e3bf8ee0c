import { abortReason, detailOf, EcoRouterHttpError } from "./errors.js";
import { bearer, type ConnectionOptions } from "./follow.js";
import { hex } from "./text_check.js";
import { backoffMs, retryAfterMs, sleep } from "./timing.js";
import { webCrypto } from "./web_crypto.js";

/** What the gateway answers a recorded cancel or input (202; docs/CONTROL.md). */
export interface ControlReceipt {
  request_id: string;
  message_id: string;
  number: number;
  kind: "cancel" | "input";
  job_id: string;
  events: string;
  /** True when an earlier try under the same request id had been recorded already. */
  replayed: boolean;
}

export interface ControlOptions extends ConnectionOptions {
  /** The request id; one made of 128 random bits when not given. */
  requestId?: string;
  /** How many times to try in all (6), on network errors, 429 and 503. */
  attempts?: number;
}

/** An unpredictable request id, so no other viewer can guess (and take) it. */
export async function newRequestId(kind: string): Promise<string> {
  const crypto = await webCrypto();
  if (crypto === undefined) throw new Error("no Web Crypto here to make a request id with");
  return `${kind}-${hex(crypto.getRandomValues(new Uint8Array(16)))}`;
}

/** Statuses after which the same request, under the same id, may be recorded. */
const RETRIED = new Set([429, 502, 503, 504]);

/**
 * Posts a cancel or an input under one request id (`Idempotency-Key`), tried again with the
 * same id on network errors and on 429, 502, 503, 504 (after their `Retry-After`): the gateway
 * records it once whatever the number of tries. Any other refusal (401, 403, 404 for a job
 * without events, 409 for a job that has ended, 422, …) rejects with `EcoRouterHttpError`.
 */
export async function sendControl(
  domain: string,
  jobId: string,
  kind: "cancel" | "input",
  body: Record<string, unknown>,
  options: ControlOptions = {},
): Promise<ControlReceipt> {
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  const signal = options.signal ?? new AbortController().signal;
  const requestId = options.requestId ?? (await newRequestId(kind));
  const attempts = options.attempts ?? 6;
  const url = `${options.baseUrl ?? ""}/api/v1/${encodeURIComponent(domain)}/${encodeURIComponent(jobId)}/${kind}`;
  for (let attempt = 1; ; attempt += 1) {
    if (signal.aborted) throw abortReason(signal);
    let wait: number;
    try {
      const response = await fetchImpl(url, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          "Idempotency-Key": requestId,
          ...(await bearer(options)),
        },
        body: JSON.stringify(body),
        credentials: options.credentials ?? "same-origin",
        signal,
      });
      if (response.status === 202) {
        const receipt = (await response.json()) as Omit<ControlReceipt, "replayed">;
        return { ...receipt, replayed: response.headers.get("Idempotent-Replayed") === "true" };
      }
      const detail = await detailOf(response);
      if (!RETRIED.has(response.status) || attempt >= attempts) {
        throw new EcoRouterHttpError(response.status, detail, url);
      }
      wait = backoffMs(attempt, options.backoff, retryAfterMs(response));
    } catch (error) {
      if (error instanceof EcoRouterHttpError) throw error;
      if (signal.aborted) throw abortReason(signal);
      // A network error: the request may have been recorded; the same id answers either way.
      if (attempt >= attempts) throw error;
      wait = backoffMs(attempt, options.backoff);
    }
    await sleep(wait, signal);
  }
}
