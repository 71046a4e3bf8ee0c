/**
 * eco-router's client: watch a job (or many on one connection) with its text kept exactly
 * across reconnects and checked at its end; cancel it or answer it, retried safely.
 */
export { type ControlOptions, type ControlReceipt, newRequestId, sendControl } from "./control.js";
export { EcoRouterHttpError } from "./errors.js";
export type { ConnectionOptions, ConnectionStatus, Frame } from "./follow.js";
export {
  type Change,
  FIRST_TOKEN_SEQ,
  type JobEvent,
  type JobFrame,
  JobView,
  type Outcome,
  type TextCheck,
} from "./job_view.js";
export { textMatches } from "./text_check.js";
export type { Backoff } from "./timing.js";
export {
  type JobEnd,
  type JobName,
  type JobsWatch,
  type JobWatch,
  type WatchCallbacks,
  type WatchOptions,
  watchJob,
  watchJobs,
} from "./watch.js";
