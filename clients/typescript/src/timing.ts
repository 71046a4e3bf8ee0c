/** How long to wait before trying again: doubling from `initialMs` up to `maxMs`. */
export interface Backoff {
  /** The first wait, in milliseconds (500). */
  initialMs?: number;
  /** The longest wait, in milliseconds (10,000). */
  maxMs?: number;
}

/**
 * The wait before try number `failures` (1, 2, …): half of it fixed, half random, so many
 * clients cut at once do not come back at once; never less than the server's `Retry-After`.
 */
export function backoffMs(failures: number, backoff: Backoff = {}, retryAfterMs = 0): number {
  const initial = backoff.initialMs ?? 500;
  const max = backoff.maxMs ?? 10_000;
  const base = Math.min(max, initial * 2 ** Math.max(0, failures - 1));
  return Math.max(retryAfterMs, base / 2 + (Math.random() * base) / 2);
}

/** `Retry-After` in milliseconds (seconds or an HTTP date); 0 when absent or unreadable. */
export function retryAfterMs(response: Response): number {
  const value = response.headers.get("Retry-After");
  if (value === null) return 0;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const date = Date.parse(value);
  return Number.isNaN(date) ? 0 : Math.max(0, date - Date.now());
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
