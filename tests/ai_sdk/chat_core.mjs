// The AI SDK's own chat (AbstractChat, what useChat runs) and DefaultChatTransport reading a
// chat job from eco-router: web APIs only, so node (chat.mjs) and a browser (chat.html) run
// the same code.

import { AbstractChat, DefaultChatTransport } from "ai";

// The chat's state as a framework keeps it (useChat keeps it in React state).
export class MemoryState {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
    this.changed = () => {};
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
    this.changed();
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
    this.changed();
  }
  replaceMessage(index, message) {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
    this.changed();
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

export class MemoryChat extends AbstractChat {
  constructor(options) {
    const state = new MemoryState();
    super({ ...options, state });
    this.memory = state;
  }
}

// What an app gives its transport: eco-router's job stream for a send, and the reconnect path
// `${api}/${chatId}/stream` as it is, the chat's id being the job's.
export function transport(base, { cutAfterDeltas, seen, api } = {}) {
  let cuts = cutAfterDeltas === undefined ? 0 : 1;
  return new DefaultChatTransport({
    api: api ?? `${base}/api/v1/chat`,
    prepareSendMessagesRequest: ({ id }) => ({ api: `${base}/api/v1/chat/${id}/stream`, body: {} }),
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      seen?.push({ method: init?.method ?? "GET", status: response.status });
      if (cuts === 0 || response.body === null) return response;
      cuts -= 1;
      return new Response(cutAfter(response.body, cutAfterDeltas), response);
    },
  });
}

// The body as the network delivers it, until `deltas` text deltas came: then the connection
// is closed under the reader, which gets the error a browser gets for a dropped connection.
function cutAfter(body, deltas) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let count = 0;
  return new ReadableStream({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) return controller.close();
      controller.enqueue(value);
      count += decoder.decode(value, { stream: true }).split('"type":"text-delta"').length - 1;
      if (count >= deltas) {
        await reader.cancel();
        controller.error(new TypeError("network error"));
      }
    },
    cancel: () => reader.cancel(),
  });
}

function answerOf(chat) {
  const last = chat.messages.at(-1);
  if (last === undefined || last.role !== "assistant") return null;
  return {
    id: last.id,
    text: last.parts.filter((p) => p.type === "text").map((p) => p.text).join(""),
    metadata: last.metadata ?? null,
  };
}

export async function resume(base, job, cutAfterDeltas) {
  const seen = [];
  const chat = new MemoryChat({ id: job, transport: transport(base, { cutAfterDeltas, seen }) });
  await chat.sendMessage({ text: "hello" });
  const cut = { status: chat.status, answer: answerOf(chat) };
  await chat.resumeStream();
  return { cut, status: chat.status, error: chat.error?.message ?? null, answer: answerOf(chat), seen };
}

export async function stop(base, job, stopAfterChars) {
  const chat = new MemoryChat({ id: job, transport: transport(base) });
  let stopping = null;
  chat.memory.changed = () => {
    const answer = answerOf(chat);
    if (stopping === null && answer !== null && answer.text.length >= stopAfterChars) {
      stopping = stopAndCancel(chat, base, answer.id);
    }
  };
  await chat.sendMessage({ text: "hello" });
  const cancel = await stopping;
  return { status: chat.status, answer: answerOf(chat), cancel };
}

// What an app's stop button does: the chat stops reading, and the job is cancelled. The
// assistant message's id is the job's (eco-router's `start` part names it).
async function stopAndCancel(chat, base, job) {
  await chat.stop();
  const response = await fetch(`${base}/api/v1/chat/${job}/cancel`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": `stop-${job}` },
    body: JSON.stringify({ reason: "stopped" }),
  });
  return { status: response.status, body: await response.json() };
}

export async function send(base, job) {
  const chat = new MemoryChat({ id: job, transport: transport(base) });
  await chat.sendMessage({ text: "hello" });
  return { status: chat.status, error: chat.error?.message ?? null, answer: answerOf(chat) };
}

// `api`: where the app's reconnects go (`${api}/${job}/stream`), eco-router's by default.
export async function reconnect(base, job, api) {
  const stream = await transport(base, { api }).reconnectToStream({ chatId: job });
  if (stream === null) return { resumed: false };
  const chunks = [];
  const reader = stream.getReader();
  for (let read = await reader.read(); !read.done; read = await reader.read()) {
    chunks.push(read.value);
  }
  return { resumed: true, chunks };
}
