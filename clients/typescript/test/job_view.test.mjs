// JobView alone: what each frame does to what a viewer holds, without a server.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { FIRST_TOKEN_SEQ, JobView } from "../dist/index.js";

const token = (id, seq, content, extra = {}) => ({
  name: "token",
  id,
  data: { event_id: id, seq, stage: "token", content, ...extra },
});

describe("JobView", () => {
  test("tokens append and a repeated id is ignored", () => {
    const view = new JobView("chat", "J");
    view.apply(token(5, 1001, "안녕"));
    view.apply(token(6, 1002, "하세요"));
    assert.deepEqual(view.apply(token(6, 1002, "하세요")), { kind: "ignored" });
    assert.equal(view.text, "안녕하세요");
    assert.equal(view.tokens, 2);
    assert.equal(view.lastEventId, 6);
  });

  test("a recovery replaces the text and its tokens count", () => {
    const view = new JobView("chat", "J", 4);
    const change = view.apply({
      name: "token_recovery",
      id: 40,
      data: { event_id: 40, accumulated: "the whole text", last_seq: FIRST_TOKEN_SEQ + 35 },
    });
    assert.deepEqual(change, { kind: "text", how: "recovery" });
    assert.equal(view.text, "the whole text");
    assert.equal(view.tokens, 36);
    view.apply(token(41, FIRST_TOKEN_SEQ + 36, "!"));
    assert.equal(view.tokens, 37);
  });

  test("a recovery at the last id replaces the text; one below it is ignored", () => {
    const view = new JobView("chat", "J");
    view.apply(token(7, 1001, "ab"));
    const recovery = (id, text) => ({
      name: "token_recovery",
      id,
      data: { event_id: id, accumulated: text, last_seq: 1001 },
    });
    assert.equal(view.apply(recovery(6, "x")).kind, "ignored");
    view.apply(recovery(7, "ab"));
    assert.equal(view.text, "ab");
  });

  test("a restart starts the text again from its token", () => {
    const view = new JobView("chat", "J");
    view.apply(token(1, 1001, "first "));
    view.apply(token(2, 1002, "try"));
    view.apply(token(3, 1001, "again", { restart: true, attempt: 1 }));
    assert.equal(view.text, "again");
    assert.equal(view.tokens, 1);
    assert.equal(view.attempt, 1);
  });

  test("done ends it, cancelled as its own outcome, and nothing applies after", () => {
    const view = new JobView("chat", "J");
    const end = view.apply({
      name: "done",
      id: 9,
      data: { event_id: 9, stage: "done", status: "cancelled" },
    });
    assert.equal(end.kind, "end");
    assert.equal(view.outcome, "cancelled");
    assert.equal(view.apply(token(10, 1001, "late")).kind, "ignored");
  });

  test("a timeout without an id ends it; a failed event is a failure", () => {
    const timedOut = new JobView("scan", "J");
    timedOut.apply({ name: "error", id: null, data: { error: "timeout" } });
    assert.equal(timedOut.outcome, "timeout");
    const failed = new JobView("scan", "J");
    failed.apply({ name: "error", id: 32, data: { event_id: 32, seq: 32, status: "failed" } });
    assert.equal(failed.outcome, "failed");
    assert.equal(failed.state.seq, 32);
  });

  test("on the many-jobs stream (no frame id) a failed event with an error is a failure", () => {
    const view = new JobView("scan", "J");
    view.apply({
      name: "error",
      id: null,
      data: { event_id: 32, seq: 32, status: "failed", error: "timeout" },
    });
    assert.equal(view.outcome, "failed");
    const idle = new JobView("scan", "J");
    idle.apply({ name: "error", id: null, data: { error: "idle" } });
    assert.equal(idle.outcome, "idle");
  });

  test("a snapshot with a state says events may have been missed", () => {
    const view = new JobView("scan", "J");
    assert.deepEqual(view.apply({ name: "snapshot", id: null, data: { state: null } }), {
      kind: "snapshot",
      state: null,
      missed: false,
    });
    const state = { seq: 31, progress: 60 };
    assert.equal(view.apply({ name: "snapshot", id: null, data: { state } }).missed, true);
    assert.equal(view.state, state);
  });

  test("lifecycle events are told but leave the state as it was", () => {
    const view = new JobView("chat", "J");
    view.apply({ name: "intent", id: 1, data: { event_id: 1, seq: 10, stage: "intent" } });
    view.apply({ name: "needs_input", id: 2, data: { event_id: 2, seq: 190 } });
    assert.equal(view.state.stage, "intent");
  });
});
