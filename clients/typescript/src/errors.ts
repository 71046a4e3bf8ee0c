/** An answer of the gateway that retrying cannot change (401, 403, 404, 409, 422, …). */
export class EcoRouterHttpError extends Error {
  override readonly name = "EcoRouterHttpError";

  constructor(
    readonly status: number,
    readonly detail: string,
    readonly url: string,
  ) {
    super(`${status} from ${url}: ${detail}`);
  }
}

/** The one-line reason of a refusal: FastAPI's `{"detail": …}`, else the body's text. */
export async function detailOf(response: Response): Promise<string> {
  const body = await response.text().catch(() => "");
  try {
    const parsed: unknown = JSON.parse(body);
    if (parsed !== null && typeof parsed === "object" && "detail" in parsed) {
      const detail = (parsed as { detail: unknown }).detail;
      return typeof detail === "string" ? detail : JSON.stringify(detail);
    }
  } catch {
    // not JSON: the text itself says why
  }
  return body || response.statusText;
}

/** The reason an aborted signal carries, as `fetch` would throw it. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("The operation was aborted.", "AbortError");
}
