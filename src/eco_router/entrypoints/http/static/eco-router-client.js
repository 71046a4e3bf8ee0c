// src/eco_router/entrypoints/http/static/eco-router-client.js: GENERATED, do not edit.
// Made from clients/typescript/src by `make ts-bundle` (npm run bundle: esbuild, one ES
// module); `make test` fails when it differs from what the sources make. It includes
// eventsource-parser (MIT License, Copyright (c) Espen Hovlandsdal).

// src/errors.ts
var EcoRouterHttpError = class extends Error {
  constructor(status, detail, url) {
    super(`${status} from ${url}: ${detail}`);
    this.status = status;
    this.detail = detail;
    this.url = url;
  }
  status;
  detail;
  url;
  name = "EcoRouterHttpError";
};
async function detailOf(response) {
  const body = await response.text().catch(() => "");
  try {
    const parsed = JSON.parse(body);
    if (parsed !== null && typeof parsed === "object" && "detail" in parsed) {
      const detail = parsed.detail;
      return typeof detail === "string" ? detail : JSON.stringify(detail);
    }
  } catch {
  }
  return body || response.statusText;
}
function abortReason(signal) {
  return signal.reason ?? new DOMException("The operation was aborted.", "AbortError");
}

// node_modules/eventsource-parser/dist/index.js
var ParseError = class extends Error {
  constructor(message, options) {
    super(message), this.name = "ParseError", this.type = options.type, this.field = options.field, this.value = options.value, this.line = options.line;
  }
};
var LF = 10;
var CR = 13;
var SPACE = 32;
function noop(_arg) {
}
function createParser(config) {
  if (typeof config == "function")
    throw new TypeError(
      "`config` must be an object, got a function instead. Did you mean `createParser({onEvent: fn})`?"
    );
  const { onEvent = noop, onError = noop, onRetry = noop, onComment, maxBufferSize } = config, pendingFragments = [];
  let pendingFragmentsLength = 0, isFirstChunk = true, id, data = "", dataLines = 0, eventType, terminated = false;
  function feed(chunk) {
    if (terminated)
      throw new Error(
        "Cannot feed parser: it was terminated after exceeding the configured max buffer size. Call `reset()` to resume parsing."
      );
    if (isFirstChunk && (isFirstChunk = false, chunk.charCodeAt(0) === 239 && chunk.charCodeAt(1) === 187 && chunk.charCodeAt(2) === 191 && (chunk = chunk.slice(3))), pendingFragments.length === 0) {
      const trailing2 = processLines(chunk);
      trailing2 !== "" && (pendingFragments.push(trailing2), pendingFragmentsLength = trailing2.length), checkBufferSize();
      return;
    }
    if (chunk.indexOf(`
`) === -1 && chunk.indexOf("\r") === -1) {
      pendingFragments.push(chunk), pendingFragmentsLength += chunk.length, checkBufferSize();
      return;
    }
    pendingFragments.push(chunk);
    const input = pendingFragments.join("");
    pendingFragments.length = 0, pendingFragmentsLength = 0;
    const trailing = processLines(input);
    trailing !== "" && (pendingFragments.push(trailing), pendingFragmentsLength = trailing.length), checkBufferSize();
  }
  function checkBufferSize() {
    maxBufferSize !== void 0 && (pendingFragmentsLength + data.length <= maxBufferSize || (terminated = true, pendingFragments.length = 0, pendingFragmentsLength = 0, id = void 0, data = "", dataLines = 0, eventType = void 0, onError(
      new ParseError(`Buffered data exceeded max buffer size of ${maxBufferSize} characters`, {
        type: "max-buffer-size-exceeded"
      })
    )));
  }
  function processLines(chunk) {
    let searchIndex = 0;
    if (chunk.indexOf("\r") === -1) {
      let lfIndex = chunk.indexOf(`
`, searchIndex);
      for (; lfIndex !== -1; ) {
        if (searchIndex === lfIndex) {
          dataLines > 0 && onEvent({ id, event: eventType, data }), id = void 0, data = "", dataLines = 0, eventType = void 0, searchIndex = lfIndex + 1, lfIndex = chunk.indexOf(`
`, searchIndex);
          continue;
        }
        const firstCharCode = chunk.charCodeAt(searchIndex);
        if (isDataPrefix(chunk, searchIndex, firstCharCode)) {
          const valueStart = chunk.charCodeAt(searchIndex + 5) === SPACE ? searchIndex + 6 : searchIndex + 5, value = chunk.slice(valueStart, lfIndex);
          if (dataLines === 0 && chunk.charCodeAt(lfIndex + 1) === LF) {
            onEvent({ id, event: eventType, data: value }), id = void 0, data = "", eventType = void 0, searchIndex = lfIndex + 2, lfIndex = chunk.indexOf(`
`, searchIndex);
            continue;
          }
          data = dataLines === 0 ? value : `${data}
${value}`, dataLines++;
        } else isEventPrefix(chunk, searchIndex, firstCharCode) ? eventType = chunk.slice(
          chunk.charCodeAt(searchIndex + 6) === SPACE ? searchIndex + 7 : searchIndex + 6,
          lfIndex
        ) || void 0 : parseLine(chunk, searchIndex, lfIndex);
        searchIndex = lfIndex + 1, lfIndex = chunk.indexOf(`
`, searchIndex);
      }
      return chunk.slice(searchIndex);
    }
    for (; searchIndex < chunk.length; ) {
      const crIndex = chunk.indexOf("\r", searchIndex), lfIndex = chunk.indexOf(`
`, searchIndex);
      let lineEnd = -1;
      if (crIndex !== -1 && lfIndex !== -1 ? lineEnd = crIndex < lfIndex ? crIndex : lfIndex : crIndex !== -1 ? crIndex === chunk.length - 1 ? lineEnd = -1 : lineEnd = crIndex : lfIndex !== -1 && (lineEnd = lfIndex), lineEnd === -1)
        break;
      parseLine(chunk, searchIndex, lineEnd), searchIndex = lineEnd + 1, chunk.charCodeAt(searchIndex - 1) === CR && chunk.charCodeAt(searchIndex) === LF && searchIndex++;
    }
    return chunk.slice(searchIndex);
  }
  function parseLine(chunk, start, end) {
    if (start === end) {
      dispatchEvent();
      return;
    }
    const firstCharCode = chunk.charCodeAt(start);
    if (isDataPrefix(chunk, start, firstCharCode)) {
      const valueStart = chunk.charCodeAt(start + 5) === SPACE ? start + 6 : start + 5, value2 = chunk.slice(valueStart, end);
      data = dataLines === 0 ? value2 : `${data}
${value2}`, dataLines++;
      return;
    }
    if (isEventPrefix(chunk, start, firstCharCode)) {
      eventType = chunk.slice(chunk.charCodeAt(start + 6) === SPACE ? start + 7 : start + 6, end) || void 0;
      return;
    }
    if (firstCharCode === 105 && chunk.charCodeAt(start + 1) === 100 && chunk.charCodeAt(start + 2) === 58) {
      const value2 = chunk.slice(chunk.charCodeAt(start + 3) === SPACE ? start + 4 : start + 3, end);
      value2.includes("\0") || (id = value2);
      return;
    }
    if (firstCharCode === 58) {
      if (onComment) {
        const line2 = chunk.slice(start, end);
        onComment(line2.slice(chunk.charCodeAt(start + 1) === SPACE ? 2 : 1));
      }
      return;
    }
    const line = chunk.slice(start, end), fieldSeparatorIndex = line.indexOf(":");
    if (fieldSeparatorIndex === -1) {
      processField(line, "", line);
      return;
    }
    const field = line.slice(0, fieldSeparatorIndex), offset = line.charCodeAt(fieldSeparatorIndex + 1) === SPACE ? 2 : 1, value = line.slice(fieldSeparatorIndex + offset);
    processField(field, value, line);
  }
  function processField(field, value, line) {
    switch (field) {
      case "event":
        eventType = value || void 0;
        break;
      case "data":
        data = dataLines === 0 ? value : `${data}
${value}`, dataLines++;
        break;
      case "id":
        value.includes("\0") || (id = value);
        break;
      case "retry":
        /^\d+$/.test(value) ? onRetry(parseInt(value, 10)) : onError(
          new ParseError(`Invalid \`retry\` value: "${value}"`, {
            type: "invalid-retry",
            value,
            line
          })
        );
        break;
      default:
        onError(
          new ParseError(
            `Unknown field "${field.length > 20 ? `${field.slice(0, 20)}\u2026` : field}"`,
            { type: "unknown-field", field, value, line }
          )
        );
        break;
    }
  }
  function dispatchEvent() {
    dataLines > 0 && onEvent({
      id,
      event: eventType,
      data
    }), id = void 0, data = "", dataLines = 0, eventType = void 0;
  }
  function reset(options = {}) {
    if (options.consume && pendingFragments.length > 0) {
      const incompleteLine = pendingFragments.join("");
      parseLine(incompleteLine, 0, incompleteLine.length);
    }
    isFirstChunk = true, id = void 0, data = "", dataLines = 0, eventType = void 0, pendingFragments.length = 0, pendingFragmentsLength = 0, terminated = false;
  }
  return { feed, reset };
}
function isDataPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 100 && chunk.charCodeAt(i + 1) === 97 && chunk.charCodeAt(i + 2) === 116 && chunk.charCodeAt(i + 3) === 97 && chunk.charCodeAt(i + 4) === 58;
}
function isEventPrefix(chunk, i, firstCharCode) {
  return firstCharCode === 101 && chunk.charCodeAt(i + 1) === 118 && chunk.charCodeAt(i + 2) === 101 && chunk.charCodeAt(i + 3) === 110 && chunk.charCodeAt(i + 4) === 116 && chunk.charCodeAt(i + 5) === 58;
}

// src/timing.ts
function backoffMs(failures, backoff = {}, retryAfterMs2 = 0) {
  const initial = backoff.initialMs ?? 500;
  const max = backoff.maxMs ?? 1e4;
  const base = Math.min(max, initial * 2 ** Math.max(0, failures - 1));
  return Math.max(retryAfterMs2, base / 2 + Math.random() * base / 2);
}
function retryAfterMs(response) {
  const value = response.headers.get("Retry-After");
  if (value === null) return 0;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1e3);
  const date = Date.parse(value);
  return Number.isNaN(date) ? 0 : Math.max(0, date - Date.now());
}
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
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

// src/follow.ts
var RETRIED = /* @__PURE__ */ new Set([408, 425, 429, 500, 502, 503, 504]);
async function bearer(options) {
  const token = typeof options.token === "function" ? await options.token() : options.token;
  return token ? { Authorization: `Bearer ${token}` } : {};
}
async function follow(url, options, follower, signal, onConnection) {
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  let failures = 0;
  for (; ; ) {
    if (signal.aborted) throw abortReason(signal);
    const lastEventId = follower.lastEventId();
    follower.status({ state: "connecting", lastEventId });
    const connection2 = new AbortController();
    const stop = () => connection2.abort(signal.reason);
    signal.addEventListener("abort", stop, { once: true });
    onConnection(() => connection2.abort(new DOMException("dropped", "AbortError")));
    let framed = false;
    let cause;
    try {
      const headers = {
        Accept: "text/event-stream",
        ...await bearer(options)
      };
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      const response = await fetchImpl(url, {
        headers,
        credentials: options.credentials ?? "same-origin",
        signal: connection2.signal
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
        const wait2 = backoffMs(failures, options.backoff, retryAfterMs(response));
        follower.status({ state: "refused", status: response.status, retryInMs: wait2 });
        await sleep(wait2, signal);
        continue;
      }
      follower.status({ state: "live" });
      let over = false;
      const parser = createParser({
        onEvent(message) {
          if (over) return;
          framed = true;
          over = follower.frame({
            name: message.event ?? "message",
            data: message.data,
            id: message.id ?? null
          });
        }
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      try {
        while (!over) {
          const { done, value } = await reader.read();
          if (done) break;
          parser.feed(value);
        }
      } finally {
        if (over) await reader.cancel().catch(() => void 0);
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
    failures = framed ? 1 : failures + 1;
    const wait = backoffMs(failures, options.backoff);
    follower.status({ state: "reconnecting", retryInMs: wait, error: cause });
    await sleep(wait, signal);
  }
}

// src/web_crypto.ts
async function webCrypto() {
  if (globalThis.crypto !== void 0) return globalThis.crypto;
  const nodeCrypto = "node:crypto";
  try {
    const module = await import(nodeCrypto);
    return module.webcrypto;
  } catch {
    return void 0;
  }
}

// src/text_check.ts
async function textMatches(text, check) {
  const bytes = new TextEncoder().encode(text);
  if (bytes.length !== check.bytes) return false;
  const subtle = (await webCrypto())?.subtle;
  if (subtle === void 0) return null;
  const digest = new Uint8Array(await subtle.digest("SHA-1", bytes));
  return hex(digest) === check.sha1;
}
function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// src/control.ts
async function newRequestId(kind) {
  const crypto = await webCrypto();
  if (crypto === void 0) throw new Error("no Web Crypto here to make a request id with");
  return `${kind}-${hex(crypto.getRandomValues(new Uint8Array(16)))}`;
}
var RETRIED2 = /* @__PURE__ */ new Set([429, 502, 503, 504]);
async function sendControl(domain, jobId, kind, body, options = {}) {
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  const signal = options.signal ?? new AbortController().signal;
  const requestId = options.requestId ?? await newRequestId(kind);
  const attempts = options.attempts ?? 6;
  const url = `${options.baseUrl ?? ""}/api/v1/${encodeURIComponent(domain)}/${encodeURIComponent(jobId)}/${kind}`;
  for (let attempt = 1; ; attempt += 1) {
    if (signal.aborted) throw abortReason(signal);
    let wait;
    try {
      const response = await fetchImpl(url, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          "Idempotency-Key": requestId,
          ...await bearer(options)
        },
        body: JSON.stringify(body),
        credentials: options.credentials ?? "same-origin",
        signal
      });
      if (response.status === 202) {
        const receipt = await response.json();
        return { ...receipt, replayed: response.headers.get("Idempotent-Replayed") === "true" };
      }
      const detail = await detailOf(response);
      if (!RETRIED2.has(response.status) || attempt >= attempts) {
        throw new EcoRouterHttpError(response.status, detail, url);
      }
      wait = backoffMs(attempt, options.backoff, retryAfterMs(response));
    } catch (error) {
      if (error instanceof EcoRouterHttpError) throw error;
      if (signal.aborted) throw abortReason(signal);
      if (attempt >= attempts) throw error;
      wait = backoffMs(attempt, options.backoff);
    }
    await sleep(wait, signal);
  }
}

// src/job_view.ts
var LIFECYCLE = /* @__PURE__ */ new Set(["cancel_requested", "input_received", "needs_input"]);
var FIRST_TOKEN_SEQ = 1001;
var JobView = class {
  domain;
  jobId;
  /** The id of the last event applied; `null` before any (the stream starts at the start). */
  lastEventId = null;
  /** The job's latest stage event, or a snapshot's state. */
  state = null;
  /** The job's text (a chat job's answer) as its tokens and recoveries built it. */
  text = "";
  /** How many tokens make `text`. */
  tokens = 0;
  /** The attempt whose text `text` is. */
  attempt = 0;
  /** How the stream ended, once it has. */
  outcome = null;
  /** The event that ended it (`done` or a failed event), when one did. */
  end = null;
  firstTokenSeq = null;
  constructor(domain, jobId, lastEventId = null) {
    this.domain = domain;
    this.jobId = jobId;
    this.lastEventId = lastEventId;
  }
  /** "domain:job_id", as the many-jobs stream names a job. */
  get key() {
    return `${this.domain}:${this.jobId}`;
  }
  /** Applies one frame of the job's stream; says what changed. */
  apply(frame) {
    if (this.outcome !== null) return { kind: "ignored" };
    const { name, data } = frame;
    if (name === "snapshot") {
      const state = data.state ?? null;
      if (state !== null) this.state = state;
      return { kind: "snapshot", state, missed: state !== null };
    }
    const gaveUp = data.error === "timeout" || data.error === "idle";
    if (name === "error" && gaveUp && frame.id === null && data.event_id === void 0) {
      return this.finish(data.error === "idle" ? "idle" : "timeout", null);
    }
    const id = typeof data.event_id === "number" ? data.event_id : frame.id;
    if (id !== null && this.lastEventId !== null) {
      const repeat = name === "token_recovery" ? id < this.lastEventId : id <= this.lastEventId;
      if (repeat) return { kind: "ignored" };
    }
    if (id !== null) this.lastEventId = id;
    if (name === "token") return this.token(data);
    if (name === "token_recovery") return this.recover(data);
    if (name === "done")
      return this.finish(data.status === "cancelled" ? "cancelled" : "done", data);
    if (name === "error") return this.finish("failed", data);
    if (!LIFECYCLE.has(name)) this.state = data;
    return { kind: "event", name, event: data };
  }
  /** Ends the view as the gateway's 204 says: the job had ended where it resumed. */
  endedBefore() {
    if (this.outcome === null) this.outcome = "ended";
  }
  token(data) {
    const seq = typeof data.seq === "number" ? data.seq : null;
    const restart = data.restart === true;
    if (restart) {
      this.text = "";
      this.tokens = 0;
      this.firstTokenSeq = seq;
      if (typeof data.attempt === "number") this.attempt = data.attempt;
    }
    if (this.firstTokenSeq === null) this.firstTokenSeq = seq;
    this.text += typeof data.content === "string" ? data.content : "";
    this.tokens = this.count(seq, this.tokens + 1);
    return { kind: "text", how: restart ? "restart" : "token" };
  }
  recover(data) {
    const attempt = typeof data.attempt === "number" ? data.attempt : 0;
    if (attempt !== this.attempt) this.firstTokenSeq = null;
    this.attempt = attempt;
    this.text = typeof data.accumulated === "string" ? data.accumulated : "";
    const lastSeq = typeof data.last_seq === "number" ? data.last_seq : null;
    if (this.firstTokenSeq === null && this.text !== "") this.firstTokenSeq = FIRST_TOKEN_SEQ;
    this.tokens = this.text === "" ? 0 : this.count(lastSeq, this.tokens);
    return { kind: "text", how: "recovery" };
  }
  count(lastSeq, otherwise) {
    if (lastSeq === null || this.firstTokenSeq === null || lastSeq < this.firstTokenSeq) {
      return otherwise;
    }
    return lastSeq - this.firstTokenSeq + 1;
  }
  finish(outcome, event) {
    this.outcome = outcome;
    this.end = event;
    if (event !== null) this.state = event;
    return { kind: "end", outcome, event };
  }
};

// src/watch.ts
function watchJob(domain, jobId, options = {}) {
  const last = options.lastEventId ?? null;
  const job = new JobView(domain, jobId, last === null ? null : Number(last));
  const url = `${options.baseUrl ?? ""}/api/v1/${encodeURIComponent(domain)}/${encodeURIComponent(jobId)}/events`;
  const stream = new Stream([job], options);
  const handle = stream.run(url, {
    lastEventId: () => job.lastEventId === null ? null : String(job.lastEventId),
    route: (frame) => {
      const data = parse(frame.data);
      const id = frame.id === null || frame.id === "" ? null : Number(frame.id);
      return data === null ? null : [job, { name: frame.name, data, id }];
    }
  });
  const control = (kind, body, extra) => sendControl(domain, jobId, kind, body, { ...connection(options), ...extra });
  const done = handle.done.then(([end]) => end);
  done.catch(() => void 0);
  return {
    job,
    done,
    drop: handle.drop,
    close: handle.close,
    cancel: (body = {}, extra) => control("cancel", body, extra),
    input: (body, extra) => control("input", body, extra)
  };
}
function watchJobs(names, options = {}) {
  const views = /* @__PURE__ */ new Map();
  for (const name of names) {
    const [domain, jobId] = typeof name === "string" ? splitName(name) : [name.domain, name.jobId];
    const view = new JobView(domain, jobId);
    views.set(view.key, view);
  }
  if (views.size === 0) throw new TypeError("watchJobs needs at least one job");
  const query = [...views.keys()].map((key) => `job=${encodeURIComponent(key)}`).join("&");
  let streamId = options.lastEventId ?? null;
  const stream = new Stream([...views.values()], options);
  const handle = stream.run(`${options.baseUrl ?? ""}/api/v1/streams?${query}`, {
    lastEventId: () => streamId,
    route: (frame) => {
      if (frame.id !== null && frame.id !== "") streamId = frame.id;
      const framed = parse(frame.data);
      if (framed === null) return null;
      const view = views.get(`${String(framed.domain)}:${String(framed.job_id)}`);
      const data = framed.data;
      if (view === void 0 || data === null || typeof data !== "object") return null;
      return [view, { name: frame.name, data, id: null }];
    }
  });
  return { jobs: views, ...handle };
}
function splitName(name) {
  const colon = name.indexOf(":");
  if (colon <= 0) throw new TypeError(`a job is named domain:job_id, got ${JSON.stringify(name)}`);
  return [name.slice(0, colon), name.slice(colon + 1)];
}
function parse(data) {
  try {
    const value = JSON.parse(data);
    return value !== null && typeof value === "object" ? value : null;
  } catch {
    return null;
  }
}
function connection(options) {
  const { baseUrl, token, credentials, fetch, signal, backoff } = options;
  return { baseUrl, token, credentials, fetch, signal, backoff };
}
var Stream = class {
  constructor(views, callbacks) {
    this.views = views;
    this.callbacks = callbacks;
    for (const view of views) {
      this.ends.push(new Promise((resolve) => this.settle.set(view, resolve)));
    }
  }
  views;
  callbacks;
  ends = [];
  settle = /* @__PURE__ */ new Map();
  run(url, routing) {
    const stop = new AbortController();
    const outer = this.callbacks.signal;
    const forward = () => stop.abort(outer?.reason);
    if (outer?.aborted) forward();
    else outer?.addEventListener("abort", forward, { once: true });
    let cut = () => void 0;
    const following = Promise.resolve().then(
      () => follow(
        url,
        this.callbacks,
        {
          lastEventId: routing.lastEventId,
          frame: (frame) => {
            this.callbacks.onFrame?.(frame);
            const routed = routing.route(frame);
            if (routed !== null) this.tell(routed[0], routed[0].apply(routed[1]));
            return this.views.every((view) => view.outcome !== null);
          },
          endedBefore: () => {
            for (const view of this.views) {
              if (view.outcome === null) {
                view.endedBefore();
                this.tell(view, { kind: "end", outcome: "ended", event: null });
              }
            }
          },
          status: (status) => this.callbacks.onStatus?.(status)
        },
        stop.signal,
        (drop) => {
          cut = drop;
        }
      )
    );
    const done = following.then(
      () => Promise.all(this.ends),
      (error) => {
        for (const view of this.views) {
          if (view.outcome === null) this.settle.get(view)?.(Promise.reject(error));
        }
        return Promise.all(this.ends);
      }
    );
    done.catch(() => void 0);
    const closed = following.finally(() => {
      outer?.removeEventListener("abort", forward);
      this.callbacks.onStatus?.({ state: "closed" });
    });
    closed.catch(() => void 0);
    return {
      done,
      drop: () => cut(),
      close: () => stop.abort(new DOMException("The watch was closed.", "AbortError"))
    };
  }
  tell(view, change) {
    const callbacks = this.callbacks;
    switch (change.kind) {
      case "snapshot":
        callbacks.onSnapshot?.(change.state, change.missed, view);
        return;
      case "text":
        callbacks.onText?.(view.text, change.how, view);
        return;
      case "event":
        callbacks.onEvent?.(change.name, change.event, view);
        return;
      case "end": {
        const end = ending(view, change.outcome, change.event);
        end.then((value) => callbacks.onEnd?.(value));
        this.settle.get(view)?.(end);
        return;
      }
      case "ignored":
        return;
    }
  }
};
async function ending(view, outcome, event) {
  const check = event?.text_check;
  const matches = check === void 0 ? null : await textMatches(view.text, check);
  return {
    domain: view.domain,
    jobId: view.jobId,
    outcome,
    event,
    text: view.text,
    tokens: view.tokens,
    textMatches: matches
  };
}
export {
  EcoRouterHttpError,
  FIRST_TOKEN_SEQ,
  JobView,
  newRequestId,
  sendControl,
  textMatches,
  watchJob,
  watchJobs
};
