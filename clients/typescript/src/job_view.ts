/** What the gateway sends about a job, and what a viewer holds of it (docs/SSE.md, CHAT.md). */

/** The size and SHA-1 of a job's text, on the end of a job that has one. */
export interface TextCheck {
  bytes: number;
  sha1: string;
  truncated: boolean;
}

/** A job's event as the router published it: the `data:` of its frame. */
export interface JobEvent {
  event_id?: number;
  prev_event_id?: number;
  job_id?: string;
  seq?: number;
  stage?: string;
  status?: string;
  progress?: number;
  result?: unknown;
  text_check?: TextCheck;
  [field: string]: unknown;
}

/** How a job's stream ended for its viewer. */
export type Outcome =
  /** `done`, any status but `cancelled`. */
  | "done"
  /** `done` with status `cancelled`. */
  | "cancelled"
  /** A failed event (`event: error` with the job's event). */
  | "failed"
  /** The gateway gave up waiting (`{"error":"timeout"}`): the job's outcome is unknown. */
  | "timeout"
  /** No news of the job for long (`{"error":"idle"}`): its outcome is unknown. */
  | "idle"
  /** The gateway answered 204: the job had ended at the position the viewer resumed from. */
  | "ended";

/** One frame of a job: its event name, its data, its event id (none for a snapshot). */
export interface JobFrame {
  name: string;
  data: JobEvent;
  id: number | null;
}

/** What one frame did to what the viewer holds. */
export type Change =
  | { kind: "ignored" }
  | { kind: "snapshot"; state: JobEvent | null; missed: boolean }
  | { kind: "text"; how: "token" | "restart" | "recovery" }
  | { kind: "event"; name: string; event: JobEvent }
  | { kind: "end"; outcome: Outcome; event: JobEvent | null };

/** Events that say something to the job's viewers without being its state. */
const LIFECYCLE = new Set(["cancel_requested", "input_received", "needs_input"]);

/**
 * The seq a writer gives its first token of an attempt when the viewer saw none of them: the
 * producer SDK's and the reference chat worker's (docs/CHAT.md). Only the token count uses it.
 */
export const FIRST_TOKEN_SEQ = 1001;

/**
 * A job as its viewer holds it, built frame by frame: its latest state, its text, its last
 * event id. No I/O: a stream feeds it frames and it says what each changed.
 *
 * - A frame whose event id is at or below the last one is a repeat and changes nothing; a
 *   `token_recovery` at the last id replaces the text (it is the text up to that id).
 * - A token appends its content; a token with `restart` starts the text again; a
 *   `token_recovery` replaces the text with `accumulated`, exactly the text up to its id.
 * - `tokens` counts the text's tokens, those a recovery brought included, from the seqs
 *   (a writer numbers an attempt's tokens one by one).
 */
export class JobView {
  readonly domain: string;
  readonly jobId: string;
  /** The id of the last event applied; `null` before any (the stream starts at the start). */
  lastEventId: number | null = null;
  /** The job's latest stage event, or a snapshot's state. */
  state: JobEvent | null = null;
  /** The job's text (a chat job's answer) as its tokens and recoveries built it. */
  text = "";
  /** How many tokens make `text`. */
  tokens = 0;
  /** The attempt whose text `text` is. */
  attempt = 0;
  /** How the stream ended, once it has. */
  outcome: Outcome | null = null;
  /** The event that ended it (`done` or a failed event), when one did. */
  end: JobEvent | null = null;
  private firstTokenSeq: number | null = null;

  constructor(domain: string, jobId: string, lastEventId: number | null = null) {
    this.domain = domain;
    this.jobId = jobId;
    this.lastEventId = lastEventId;
  }

  /** "domain:job_id", as the many-jobs stream names a job. */
  get key(): string {
    return `${this.domain}:${this.jobId}`;
  }

  /** Applies one frame of the job's stream; says what changed. */
  apply(frame: JobFrame): Change {
    if (this.outcome !== null) return { kind: "ignored" };
    const { name, data } = frame;
    if (name === "snapshot") {
      const state = (data.state ?? null) as JobEvent | null;
      if (state !== null) this.state = state;
      return { kind: "snapshot", state, missed: state !== null };
    }
    // The gateway's own ends carry no event id, unlike a failed event of the job.
    const gaveUp = data.error === "timeout" || data.error === "idle";
    if (name === "error" && gaveUp && frame.id === null && data.event_id === undefined) {
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
  endedBefore(): void {
    if (this.outcome === null) this.outcome = "ended";
  }

  private token(data: JobEvent): Change {
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

  private recover(data: JobEvent): Change {
    const attempt = typeof data.attempt === "number" ? data.attempt : 0;
    if (attempt !== this.attempt) this.firstTokenSeq = null;
    this.attempt = attempt;
    this.text = typeof data.accumulated === "string" ? data.accumulated : "";
    const lastSeq = typeof data.last_seq === "number" ? data.last_seq : null;
    if (this.firstTokenSeq === null && this.text !== "") this.firstTokenSeq = FIRST_TOKEN_SEQ;
    this.tokens = this.text === "" ? 0 : this.count(lastSeq, this.tokens);
    return { kind: "text", how: "recovery" };
  }

  private count(lastSeq: number | null, otherwise: number): number {
    if (lastSeq === null || this.firstTokenSeq === null || lastSeq < this.firstTokenSeq) {
      return otherwise;
    }
    return lastSeq - this.firstTokenSeq + 1;
  }

  private finish(outcome: Outcome, event: JobEvent | null): Change {
    this.outcome = outcome;
    this.end = event;
    if (event !== null) this.state = event;
    return { kind: "end", outcome, event };
  }
}
