import { createParser, type EventSourceMessage } from "eventsource-parser";
import { abortReason, detailOf, EcoRouterHttpError } from "./errors.js";
import { type Backoff, backoffMs, retryAfterMs, sleep } from "./timing.js";

/** How a request reaches the gateway: where, with which credentials, through which fetch. */
export interface ConnectionOptions {
  /** The gateway's origin, e.g. "https://api.example.com"; "" (the default): this page's. */
  baseUrl?: string;
  /**
   * A bearer token (or a function giving one, asked again on every connection, so an expired
   * token can be replaced), sent as `Authorization: Bearer …`. Without it, the cookie goes.
   */
  token?: string | (() => string | Promise<string>);
  /** What `fetch` does with cookies: "same-origin" (the default), or "include" across origins. */
  credentials?: RequestCredentials;
  /** Another `fetch` (a test's, a polyfill). */
  fetch?: typeof fetch;
  /** Stops everything: the stream, its retries, a control message's retries. */
  signal?: AbortSignal;
  /** Waits between tries. */
  backoff?: Backoff;
}

/** What the connection is doing, for a page to say. */
export type ConnectionStatus =
  | { state: "connecting"; lastEventId: string | null }
  | { state: "live" }
  /** The connection was lost (or dropped); the next try starts in `retryInMs`. */
  | { state: "reconnecting"; retryInMs: number; error?: unknown }
  /** The gateway refused the stream for now (`status`: 429, 503, …); tried again. */
  | { state: "refused"; status: number; retryInMs: number }
  | { state: "closed" };

/** A frame of an event stream: `event:` (default "message"), `data:`, `id:`. */
export interface Frame {
  name: string;
  data: string;
  id: string | null;
}

/** Statuses after which the same request may succeed later. */
const RETRIED = new Set([408, 425, 429, 500, 502, 503, 504]);

export async function bearer(options: ConnectionOptions): Promise<Record<string, string>> {
  const token = typeof options.token === "function" ? await options.token() : options.token;
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** How `follow` asks its owner about each frame, and tells it of the connection. */
export interface Follower {
  /** The `Last-Event-ID` to send on the next connection (`null`: from the start). */
  lastEventId(): string | null;
  /** One frame; `true` when the stream has nothing more to say (every job ended). */
  frame(frame: Frame): boolean;
  /** The gateway answered 204: everything had ended at the position sent. */
  endedBefore(): void;
  status(status: ConnectionStatus): void;
}

/**
 * Reads an event stream until its owner says it is over, reconnecting with `Last-Event-ID`
 * after every cut, with backoff; refusals that may pass (429, 503, …) are tried again after
 * their `Retry-After`; any other refusal rejects with `EcoRouterHttpError`. `drop` (given to
 * `start`) cuts the current connection on purpose, as a network would.
 */
export async function follow(
  url: string,
  options: ConnectionOptions,
  follower: Follower,
  signal: AbortSignal,
  onConnection: (cut: () => void) => void,
): Promise<void> {
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  let failures = 0;
  for (;;) {
    if (signal.aborted) throw abortReason(signal);
    const lastEventId = follower.lastEventId();
    follower.status({ state: "connecting", lastEventId });
    const connection = new AbortController();
    const stop = (): void => connection.abort(signal.reason);
    signal.addEventListener("abort", stop, { once: true });
    onConnection(() => connection.abort(new DOMException("dropped", "AbortError")));
    let framed = false;
    let cause: unknown;
    try {
      const headers: Record<string, string> = {
        Accept: "text/event-stream",
        ...(await bearer(options)),
      };
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      const response = await fetchImpl(url, {
        headers,
        credentials: options.credentials ?? "same-origin",
        signal: connection.signal,
      });
      if (response.status === 204) {
        follower.endedBefore();
        return;
      }
      if (!response.ok || response.body === null) {
        const detail = await detailOf(response);
        if (!RETRIED.has(response.status)) {
          throw new EcoRouterHttpError(response.status, detail, url);
        }
        failures += 1;
        const wait = backoffMs(failures, options.backoff, retryAfterMs(response));
        follower.status({ state: "refused", status: response.status, retryInMs: wait });
        await sleep(wait, signal);
        continue;
      }
      follower.status({ state: "live" });
      let over = false;
      const parser = createParser({
        onEvent(message: EventSourceMessage) {
          if (over) return;
          framed = true;
          over = follower.frame({
            name: message.event ?? "message",
            data: message.data,
            id: message.id ?? null,
          });
        },
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      try {
        while (!over) {
          const { done, value } = await reader.read();
          if (done) break;
          parser.feed(value);
        }
      } finally {
        if (over) await reader.cancel().catch(() => undefined);
        else reader.releaseLock();
      }
      if (over) return;
    } catch (error) {
      if (error instanceof EcoRouterHttpError) throw error;
      if (signal.aborted) throw abortReason(signal);
      cause = error;
    } finally {
      signal.removeEventListener("abort", stop);
    }
    // The stream ended or was cut before the end: resume where it stood.
    failures = framed ? 1 : failures + 1;
    const wait = backoffMs(failures, options.backoff);
    follower.status({ state: "reconnecting", retryInMs: wait, error: cause });
    await sleep(wait, signal);
  }
}
