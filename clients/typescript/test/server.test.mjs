// The client against a real `eco-router serve` on real Redis (started by
// tests/integration/test_typescript_client.py, which gives its address in ECO_ROUTER_URL).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { EcoRouterHttpError, sendControl, watchJob, watchJobs } from "../dist/index.js";
import {
  COMPLETE_JOB,
  cuttingProxy,
  mint,
  produce,
  random,
  server,
  skip,
  startDemo,
  withCookie,
} from "./support.mjs";

const QUICK = { initialMs: 20, maxMs: 200 };
const CHAT_ANSWERS = JSON.parse(process.env.ECO_ROUTER_CHAT_ANSWERS ?? "[]");
const SEED = Number(process.env.ECO_ROUTER_SEED ?? Date.now() % 1_000_000);

/** Stage events of a demo chat job: queued, intent started and completed, answer started and
 * completed (then done, 181). */
const CHAT_JOB = [0, 10, 11, 160, 161];

/** Cuts the first `cuts` connections after a random 100 to `most` bytes of the answer each
 * (its head and frames alike). */
function randomCuts(seed, cuts, most) {
  const next = random(seed);
  return (n) => (n < cuts ? 100 + Math.floor(next() * (most - 100)) : Number.POSITIVE_INFINITY);
}

/** Every stage event `watch` hands over, per job, and a check that none comes twice. */
function recorder() {
  const seen = new Map();
  return {
    seen,
    onEvent(name, event, job) {
      const ids = seen.get(job.key) ?? [];
      assert.ok(ids.length === 0 || event.event_id > ids.at(-1).event_id, `${name} twice`);
      ids.push(event);
      seen.set(job.key, ids);
    },
    seqs(key) {
      return (seen.get(key) ?? []).map((event) => event.seq);
    },
  };
}

describe("watching a job across cuts", { skip }, () => {
  test(`a chat job's text is exact after cuts at random points (seed ${SEED})`, async () => {
    const started = await startDemo("?chat=true");
    const proxy = await cuttingProxy(randomCuts(SEED, 8, 3000));
    const events = recorder();
    const frames = [];
    try {
      const watch = watchJob("chat", started.job_id, {
        baseUrl: proxy.url,
        token: mint("chat", [started.job_id]),
        backoff: QUICK,
        onEvent: events.onEvent,
        onFrame: (frame) => frames.push(frame),
      });
      const end = await watch.done;

      assert.equal(end.outcome, "done");
      assert.equal(end.textMatches, true);
      assert.ok(CHAT_ANSWERS.includes(end.text), "the text is one of the demo's answers");
      assert.deepEqual(end.event.result, { answer_chars: [...end.text].length });
      assert.ok(proxy.cuts >= 3, `only ${proxy.cuts} cuts`);
      assert.deepEqual(events.seqs(`chat:${started.job_id}`), CHAT_JOB);
      assert.equal(end.event.seq, 181);
      assert.equal(end.tokens, watch.job.tokens);
      assert.ok(end.tokens > 20, `${end.tokens} tokens`);
    } finally {
      await proxy.close();
    }
  });

  test(`a job's events come once each, in order, after cuts (seed ${SEED + 1})`, async () => {
    const started = await startDemo();
    const proxy = await cuttingProxy(randomCuts(SEED + 1, 6, 800));
    const events = recorder();
    try {
      const end = await watchJob("scan", started.job_id, {
        baseUrl: proxy.url,
        token: mint("scan", [started.job_id]),
        backoff: QUICK,
        onEvent: events.onEvent,
      }).done;

      assert.equal(end.outcome, "done");
      assert.deepEqual(events.seqs(`scan:${started.job_id}`), COMPLETE_JOB.slice(0, -1));
      assert.equal(end.event.seq, COMPLETE_JOB.at(-1));
      assert.ok(proxy.cuts >= 2, `only ${proxy.cuts} cuts`);
    } finally {
      await proxy.close();
    }
  });

  test("a retried attempt's text replaces the first one's, checked at the end", async () => {
    const job = `retried-${SEED}`;
    produce(job, "queued");
    let firstAttempt;
    const typed = new Promise((resolve) => {
      firstAttempt = resolve;
    });
    const hows = [];
    const watch = watchJob("chat", job, {
      baseUrl: server,
      token: mint("chat", [job]),
      backoff: QUICK,
      onText: (text, how) => {
        hows.push(how);
        if (text === "첫 번째 try ") firstAttempt();
      },
    });
    produce(job, "tokens", 0, "첫 ", "번째 ", "try ");
    await typed;

    produce(job, "tokens", 1, "second ", "try 🔁");
    produce(job, "done", JSON.stringify({ answer: "second" }));
    const end = await watch.done;

    assert.equal(end.outcome, "done");
    assert.equal(end.text, "second try 🔁");
    assert.equal(end.textMatches, true);
    assert.equal(watch.job.attempt, 1);
    assert.ok(hows.includes("restart") || hows.includes("recovery"), hows.join());
  });

  test("connections closed unanswered (a gateway restarting) are tried again", async () => {
    const started = await startDemo();
    const proxy = await cuttingProxy((n) => (n < 3 ? 0 : Number.POSITIVE_INFINITY));
    const statuses = [];
    try {
      const end = await watchJob("scan", started.job_id, {
        baseUrl: proxy.url,
        token: mint("scan", [started.job_id]),
        backoff: QUICK,
        onStatus: (status) => statuses.push(status.state),
      }).done;

      assert.equal(end.outcome, "done");
      assert.equal(proxy.connections, 4);
      assert.deepEqual(statuses.slice(0, 2), ["connecting", "reconnecting"]);
      assert.equal(statuses.filter((state) => state === "live").length, 1);
    } finally {
      await proxy.close();
    }
  });

  test("a job that had ended where the watch resumes ends with the gateway's 204", async () => {
    const started = await startDemo();
    const token = mint("scan", [started.job_id]);
    const first = await watchJob("scan", started.job_id, { baseUrl: server, token }).done;

    const again = await watchJob("scan", started.job_id, {
      baseUrl: server,
      token,
      lastEventId: String(first.event.event_id),
    }).done;

    assert.equal(again.outcome, "ended");
    assert.equal(again.event, null);
  });
});

describe("many jobs on one stream", { skip }, () => {
  test(`every job resumes where it stood after cuts (seed ${SEED + 2})`, async () => {
    const started = await startDemo("?count=6");
    const proxy = await cuttingProxy(randomCuts(SEED + 2, 6, 2000));
    const events = recorder();
    try {
      const ends = await watchJobs(
        started.jobs.map((jobId) => `${started.domain}:${jobId}`),
        {
          baseUrl: proxy.url,
          token: mint(started.domain, started.jobs),
          backoff: QUICK,
          onEvent: events.onEvent,
        },
      ).done;

      assert.deepEqual(
        ends.map((end) => [end.jobId, end.outcome]),
        started.jobs.map((jobId) => [jobId, "done"]),
      );
      for (const jobId of started.jobs) {
        assert.deepEqual(events.seqs(`${started.domain}:${jobId}`), COMPLETE_JOB.slice(0, -1));
      }
      assert.ok(proxy.cuts >= 2, `only ${proxy.cuts} cuts`);
    } finally {
      await proxy.close();
    }
  });
});

describe("authorization", { skip }, () => {
  test("without a token the watch is refused with 401", async () => {
    const started = await startDemo();
    await assert.rejects(watchJob("scan", started.job_id, { baseUrl: server }).done, {
      name: "EcoRouterHttpError",
      status: 401,
    });
  });

  test("a token for another job is refused with 403", async () => {
    const started = await startDemo();
    const watch = watchJob("scan", started.job_id, { baseUrl: server, token: mint("scan", ["x"]) });
    await assert.rejects(
      watch.done,
      (error) => error instanceof EcoRouterHttpError && error.status === 403,
    );
  });

  test("the demo's cookie opens its job", async () => {
    const started = await startDemo();
    assert.match(started.cookie, /^eco_router_token=/);
    const end = await watchJob("scan", started.job_id, {
      baseUrl: server,
      fetch: withCookie(started.cookie),
    }).done;
    assert.equal(end.outcome, "done");
  });
});

/** A fetch that goes to the network and notes each request's status and request id. */
function noting(inner = fetch) {
  const tries = [];
  const wrapped = async (url, init = {}) => {
    const key = new Headers(init.headers).get("Idempotency-Key");
    try {
      const response = await inner(url, init);
      tries.push({ key, status: response.status });
      return response;
    } catch (error) {
      tries.push({ key, status: "network error" });
      throw error;
    }
  };
  return { tries, fetch: wrapped };
}

describe("cancel and input", { skip }, () => {
  test("a cancel whose answer was lost is retried with its key and recorded once", async () => {
    const started = await startDemo("?chat=true");
    const token = mint("chat", [started.job_id]);
    let typing;
    const typed = new Promise((resolve) => {
      typing = resolve;
    });
    const names = [];
    const watch = watchJob("chat", started.job_id, {
      baseUrl: server,
      token,
      onText: () => typing(),
      onEvent: (name) => names.push(name),
    });
    await typed;
    // The first try reaches the server, which records it; its answer is cut before a byte.
    const proxy = await cuttingProxy((n) => (n === 0 ? 0 : Number.POSITIVE_INFINITY));
    const noted = noting();
    try {
      const receipt = await watch.cancel(
        { reason: "enough" },
        { baseUrl: proxy.url, fetch: noted.fetch, backoff: QUICK },
      );

      assert.equal(receipt.kind, "cancel");
      assert.equal(receipt.replayed, true);
      assert.deepEqual(
        noted.tries.map((t) => t.status),
        ["network error", 202],
      );
      assert.equal(noted.tries[0].key, noted.tries[1].key);
      assert.equal(receipt.request_id, noted.tries[0].key);
      assert.match(receipt.request_id, /^cancel-[0-9a-f]{32}$/);
    } finally {
      await proxy.close();
    }
    const end = await watch.done;
    assert.equal(end.outcome, "cancelled");
    assert.equal(end.textMatches, true);
    assert.equal(names.filter((name) => name === "cancel_requested").length, 1);
  });

  test("an input refused with 429 is retried after Retry-After with its key", async () => {
    // The server allows a burst of 2 messages per sender and job, then 1 a second.
    const started = await startDemo("?chat=true&ask=true");
    const token = mint("chat", [started.job_id]);
    let asked;
    const question = new Promise((resolve) => {
      asked = resolve;
    });
    const received = [];
    const watch = watchJob("chat", started.job_id, {
      baseUrl: server,
      token,
      onEvent: (name, event) => {
        if (name === "needs_input") asked(event);
        if (name === "input_received") received.push(event.request_id);
      },
    });
    const { result } = await question;
    const noted = noting();
    const options = { baseUrl: server, token, fetch: noted.fetch, backoff: QUICK };

    const receipts = [];
    for (const answer of [result.options[1], "again", "and again"]) {
      receipts.push(await watch.input({ input: answer }, options));
    }

    assert.deepEqual(
      receipts.map((r) => r.number),
      [1, 2, 3],
    );
    const third = noted.tries.filter((t) => t.key === receipts[2].request_id);
    assert.deepEqual(
      third.map((t) => t.status),
      [429, 202],
    );
    const end = await watch.done;
    assert.equal(end.outcome, "done");
    assert.equal(end.text, CHAT_ANSWERS[1]);
    assert.deepEqual(
      received,
      receipts.map((r) => r.request_id),
    );
  });

  test("a job without events is 404, answered at once, not retried", async () => {
    const noted = noting();
    await assert.rejects(
      sendControl(
        "scan",
        "never-started",
        "cancel",
        {},
        {
          baseUrl: server,
          token: mint("scan", ["never-started"]),
          fetch: noted.fetch,
        },
      ),
      { name: "EcoRouterHttpError", status: 404 },
    );
    assert.deepEqual(
      noted.tries.map((t) => t.status),
      [404],
    );
  });

  test("a job that has ended refuses a cancel with 409", async () => {
    const started = await startDemo();
    const token = mint("scan", [started.job_id]);
    const watch = watchJob("scan", started.job_id, { baseUrl: server, token });
    await watch.done;
    await assert.rejects(watch.cancel({}, { baseUrl: server, token }), { status: 409 });
  });
});

describe("stopping a watch", { skip }, () => {
  test("an aborted signal ends the watch: done rejects with its reason", async () => {
    const started = await startDemo();
    const controller = new AbortController();
    const watch = watchJob("scan", started.job_id, {
      baseUrl: server,
      token: mint("scan", [started.job_id]),
      signal: controller.signal,
      onEvent: () => controller.abort(new Error("seen enough")),
    });
    await assert.rejects(watch.done, { message: "seen enough" });
    assert.equal(watch.job.outcome, null);
  });
});
