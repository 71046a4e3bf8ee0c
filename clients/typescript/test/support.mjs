// What the tests against a real `eco-router serve` share: its address, demo jobs, tokens,
// and a proxy that cuts connections where the test says.
import { execFileSync } from "node:child_process";
import net from "node:net";

/** The server the test runner (tests/integration/test_typescript_client.py) started. */
export const server = process.env.ECO_ROUTER_URL ?? "";
export const skip = server === "" ? "ECO_ROUTER_URL is not set: run through pytest" : false;

/** Seqs of a demo job's stage events (vision, rule, answer, reward, then done). */
export const COMPLETE_JOB = [0, 10, 11, 20, 21, 30, 31, 40, 41, 51];

/**
 * Starts demo jobs; returns the answer and the token cookie it set. The endpoint lets a client
 * start a few at once, then one every 2 s: a 429 is waited out as its Retry-After says.
 */
export async function startDemo(query = "") {
  let response = await fetch(`${server}/api/v1/demo/jobs${query}`, { method: "POST" });
  while (response.status === 429) {
    const wait = Number(response.headers.get("retry-after") ?? "1");
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    response = await fetch(`${server}/api/v1/demo/jobs${query}`, { method: "POST" });
  }
  if (response.status !== 201) throw new Error(`demo jobs: ${response.status}`);
  const cookie = (response.headers.get("set-cookie") ?? "").split(";")[0];
  return { ...(await response.json()), cookie };
}

/** A viewer's token for `jobs` of `domain`, from `eco-router token`, as an operator mints one. */
export function mint(domain, jobs) {
  const [command, ...args] = JSON.parse(process.env.ECO_ROUTER_CLI ?? "[]");
  const jobArgs = jobs.flatMap((job) => ["--job", job]);
  return execFileSync(command, [...args, "token", "--domain", domain, ...jobArgs], {
    encoding: "utf8",
  }).trim();
}

/** A fetch that sends `cookie`, as a browser would (Node's fetch keeps no cookies). */
export function withCookie(cookie, inner = fetch) {
  return (url, init = {}) =>
    inner(url, { ...init, headers: { ...Object.fromEntries(new Headers(init.headers)), cookie } });
}

/** A seeded random source (mulberry32), so a failing run can be told again. */
export function random(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A TCP proxy to the server. For each connection, `plan(n)` (n = 0, 1, …) says after how many
 * bytes of the server's answer to cut it (`Infinity`: never); the cut ends both sockets
 * there, inside a frame or a header as it falls. `connections` counts them.
 */
export async function cuttingProxy(plan) {
  const target = new URL(server);
  const sockets = new Set();
  const proxy = { connections: 0, cuts: 0, url: "" };
  const listener = net.createServer((client) => {
    const budget = plan(proxy.connections);
    proxy.connections += 1;
    let sent = 0;
    let cut = false;
    const upstream = net.connect(Number(target.port), target.hostname);
    sockets.add(client);
    sockets.add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("data", (chunk) => upstream.write(chunk));
    upstream.on("data", (chunk) => {
      if (cut) return;
      if (sent + chunk.length <= budget) {
        sent += chunk.length;
        client.write(chunk);
        return;
      }
      cut = true;
      proxy.cuts += 1;
      client.write(chunk.subarray(0, Math.max(0, budget - sent)), end);
    });
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });
  await new Promise((resolve) => listener.listen(0, "127.0.0.1", resolve));
  proxy.url = `http://127.0.0.1:${listener.address().port}`;
  proxy.close = () =>
    new Promise((resolve) => {
      for (const socket of sockets) socket.destroy();
      listener.close(resolve);
    });
  return proxy;
}

/** A chat job's worker (tests/integration/typescript_producer.py): one producer SDK call. */
export function produce(job, action, ...args) {
  const [command, ...prefix] = JSON.parse(process.env.ECO_ROUTER_PRODUCER ?? "[]");
  execFileSync(command, [...prefix, job, action, ...args.map(String)], {
    cwd: process.env.ECO_ROUTER_ROOT,
    stdio: ["ignore", "ignore", "inherit"],
  });
}
