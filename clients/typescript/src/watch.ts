import { type ControlOptions, type ControlReceipt, sendControl } from "./control.js";
import { type ConnectionOptions, type ConnectionStatus, type Frame, follow } from "./follow.js";
import { type Change, type JobEvent, type JobFrame, JobView, type Outcome } from "./job_view.js";
import { textMatches } from "./text_check.js";

/** A job's end as its viewer saw it. */
export interface JobEnd {
  domain: string;
  jobId: string;
  outcome: Outcome;
  /** The `done` or failed event; `null` for a timeout, an idle job, or a 204. */
  event: JobEvent | null;
  /** The job's text as the viewer holds it ("" for a job without one). */
  text: string;
  tokens: number;
  /**
   * Whether `text` is the job's, by the end's `text_check` (bytes and SHA-1); `null` when the
   * end has no check (a job without text, a timeout) or SHA-1 is out of reach (not a secure
   * context).
   */
  textMatches: boolean | null;
}

/** What a watch calls as the job (or each job) moves; every callback is optional. */
export interface WatchCallbacks {
  /** A stage event or a lifecycle one (`needs_input`, `cancel_requested`, `input_received`). */
  onEvent?(name: string, event: JobEvent, job: JobView): void;
  /** The job's text changed: a token, a restart, or a recovery that replaced it. */
  onText?(text: string, how: "token" | "restart" | "recovery", job: JobView): void;
  /** A snapshot: `missed` when it has a state, so events may have been missed. */
  onSnapshot?(state: JobEvent | null, missed: boolean, job: JobView): void;
  /** The job's end; also what `done` resolves with. */
  onEnd?(end: JobEnd): void;
  /** What the connection is doing. */
  onStatus?(status: ConnectionStatus): void;
  /** Every frame as it came, before a repeat is dropped (for logs and tests). */
  onFrame?(frame: Frame): void;
}

export interface WatchOptions extends ConnectionOptions, WatchCallbacks {
  /** Resume after this position: a job's event id, or a many-jobs stream's id. */
  lastEventId?: string | null;
}

/** Ways to stop a watch, or to cut its connection on purpose (it resumes). */
interface Handle {
  /** Cuts the connection as a network would: the watch reconnects and resumes. */
  drop(): void;
  /** Stops watching; a `done` not yet settled rejects with an `AbortError`. */
  close(): void;
}

/** One job being watched. */
export interface JobWatch extends Handle {
  readonly job: JobView;
  /** Resolves at the job's end; rejects on a refusal retrying cannot change, or on abort. */
  readonly done: Promise<JobEnd>;
  /** Asks the job's worker to stop (one request id, retried safely). */
  cancel(body?: { reason?: string }, options?: ControlOptions): Promise<ControlReceipt>;
  /** Answers the job's `needs_input` question (one request id, retried safely). */
  input(body: Record<string, unknown>, options?: ControlOptions): Promise<ControlReceipt>;
}

/** Many jobs on one connection. */
export interface JobsWatch extends Handle {
  /** Each job by "domain:job_id". */
  readonly jobs: ReadonlyMap<string, JobView>;
  /** Resolves once every job has ended, with their ends in the order given. */
  readonly done: Promise<JobEnd[]>;
}

/** A job named as the many-jobs stream names it ("domain:job_id"), or in two parts. */
export type JobName = string | { domain: string; jobId: string };

/**
 * Watches one job: its events, its text kept exactly across reconnects and checked at its
 * end, reconnecting with backoff and `Last-Event-ID` until the job ends.
 */
export function watchJob(domain: string, jobId: string, options: WatchOptions = {}): JobWatch {
  const last = options.lastEventId ?? null;
  const job = new JobView(domain, jobId, last === null ? null : Number(last));
  const url = `${options.baseUrl ?? ""}/api/v1/${encodeURIComponent(domain)}/${encodeURIComponent(jobId)}/events`;
  const stream = new Stream([job], options);
  const handle = stream.run(url, {
    lastEventId: () => (job.lastEventId === null ? null : String(job.lastEventId)),
    route: (frame) => {
      const data = parse(frame.data);
      const id = frame.id === null || frame.id === "" ? null : Number(frame.id);
      return data === null ? null : [job, { name: frame.name, data, id }];
    },
  });
  const control = (
    kind: "cancel" | "input",
    body: Record<string, unknown>,
    extra?: ControlOptions,
  ) => sendControl(domain, jobId, kind, body, { ...connection(options), ...extra });
  const done = handle.done.then(([end]) => end as JobEnd);
  done.catch(() => undefined);
  return {
    job,
    done,
    drop: handle.drop,
    close: handle.close,
    cancel: (body = {}, extra) => control("cancel", body, extra),
    input: (body, extra) => control("input", body, extra),
  };
}

/**
 * Watches many jobs on one connection (`GET /api/v1/streams`, at most 50): each job as
 * `watchJob` would, the stream's id (every job's position) sent back on reconnects.
 */
export function watchJobs(names: readonly JobName[], options: WatchOptions = {}): JobsWatch {
  const views = new Map<string, JobView>();
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
      if (view === undefined || data === null || typeof data !== "object") return null;
      return [view, { name: frame.name, data: data as JobEvent, id: null }];
    },
  });
  return { jobs: views, ...handle };
}

function splitName(name: string): [string, string] {
  const colon = name.indexOf(":");
  if (colon <= 0) throw new TypeError(`a job is named domain:job_id, got ${JSON.stringify(name)}`);
  return [name.slice(0, colon), name.slice(colon + 1)];
}

function parse(data: string): JobEvent | null {
  try {
    const value: unknown = JSON.parse(data);
    return value !== null && typeof value === "object" ? (value as JobEvent) : null;
  } catch {
    return null;
  }
}

function connection(options: ConnectionOptions): ConnectionOptions {
  const { baseUrl, token, credentials, fetch, signal, backoff } = options;
  return { baseUrl, token, credentials, fetch, signal, backoff };
}

interface Routing {
  lastEventId(): string | null;
  route(frame: Frame): [JobView, JobFrame] | null;
}

/** The jobs of one connection, their ends, and the callbacks to tell. */
class Stream {
  private readonly ends: Promise<JobEnd>[] = [];
  private readonly settle = new Map<JobView, (end: Promise<JobEnd>) => void>();

  constructor(
    private readonly views: readonly JobView[],
    private readonly callbacks: WatchOptions,
  ) {
    for (const view of views) {
      this.ends.push(new Promise((resolve) => this.settle.set(view, resolve)));
    }
  }

  run(url: string, routing: Routing): Handle & { done: Promise<JobEnd[]> } {
    const stop = new AbortController();
    const outer = this.callbacks.signal;
    const forward = (): void => stop.abort(outer?.reason);
    if (outer?.aborted) forward();
    else outer?.addEventListener("abort", forward, { once: true });
    let cut = (): void => undefined;
    // Started after the caller has the watch in hand: no callback runs inside `watchJob`.
    const following = Promise.resolve().then(() =>
      follow(
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
          status: (status) => this.callbacks.onStatus?.(status),
        },
        stop.signal,
        (drop) => {
          cut = drop;
        },
      ),
    );
    // Every end is settled by a frame or a 204 before `follow` returns; a failure (a refusal,
    // an abort) rejects what has not ended.
    const done = following.then(
      () => Promise.all(this.ends),
      (error: unknown) => {
        for (const view of this.views) {
          if (view.outcome === null) this.settle.get(view)?.(Promise.reject(error));
        }
        return Promise.all(this.ends);
      },
    );
    done.catch(() => undefined); // a watch nobody awaits must not be an unhandled rejection
    const closed = following.finally(() => {
      outer?.removeEventListener("abort", forward);
      this.callbacks.onStatus?.({ state: "closed" });
    });
    closed.catch(() => undefined);
    return {
      done,
      drop: () => cut(),
      close: () => stop.abort(new DOMException("The watch was closed.", "AbortError")),
    };
  }

  private tell(view: JobView, change: Change): void {
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
}

async function ending(view: JobView, outcome: Outcome, event: JobEvent | null): Promise<JobEnd> {
  const check = event?.text_check;
  const matches = check === undefined ? null : await textMatches(view.text, check);
  return {
    domain: view.domain,
    jobId: view.jobId,
    outcome,
    event,
    text: view.text,
    tokens: view.tokens,
    textMatches: matches,
  };
}
