// The AI SDK's chat reading a chat job from eco-router (chat_core.mjs), from the command line.
// Prints one JSON line with what the chat holds; any failure is one line on stderr and exit
// code 1.
//
//   node chat.mjs resume <base-url> <job> <cut-after-deltas>   send, cut the connection, resume
//   node chat.mjs stop <base-url> <job> <stop-after-chars>     send, then stop: abort and cancel
//   node chat.mjs send <base-url> <job>                        send, and read to the end
//   node chat.mjs reconnect <base-url> <job> [api]             a resume alone (null: 204)

import { reconnect, resume, send, stop } from "./chat_core.mjs";

const USAGE = "usage: node chat.mjs resume|stop|send|reconnect <base-url> <job> [count or api]";

async function main([command, base, job, extra]) {
  if (!base || !job) throw new Error(USAGE);
  if (command === "resume") return resume(base, job, Number(extra ?? 5));
  if (command === "stop") return stop(base, job, Number(extra ?? 20));
  if (command === "send") return send(base, job);
  if (command === "reconnect") return reconnect(base, job, extra);
  throw new Error(USAGE);
}

main(process.argv.slice(2)).then(
  (result) => console.log(JSON.stringify(result)),
  (error) => {
    console.error(`chat.mjs: ${error?.message ?? error}`);
    process.exit(1);
  },
);
