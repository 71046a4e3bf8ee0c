// The browser bundle the demo page and the dashboard load, made from src/ with esbuild and
// committed, so `make run` needs no Node.js. `--check` builds it in memory and fails when the
// committed file differs (`make test` runs it).
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const repository = join(root, "..", "..");
const target = join(repository, "src/eco_router/entrypoints/http/static/eco-router-client.js");
const name = relative(repository, target);

const banner = `// ${name}: GENERATED, do not edit.
// Made from clients/typescript/src by \`make ts-bundle\` (npm run bundle: esbuild, one ES
// module); \`make test\` fails when it differs from what the sources make. It includes
// eventsource-parser (MIT License, Copyright (c) Espen Hovlandsdal).`;

const result = await build({
  entryPoints: [join(root, "src/index.ts")],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  legalComments: "inline",
  banner: { js: banner },
  write: false,
  absWorkingDir: root,
});
const made = result.outputFiles[0].text;

if (process.argv.includes("--check")) {
  let committed = "";
  try {
    committed = readFileSync(target, "utf8");
  } catch {
    // missing: reported below as a difference
  }
  if (committed !== made) {
    console.error(
      `${name} is not what clients/typescript/src makes: run \`make ts-bundle\` and commit it`,
    );
    process.exit(1);
  }
  console.log(`${name} is what clients/typescript/src makes`);
} else {
  writeFileSync(target, made);
  console.log(`wrote ${name} (${made.length} bytes)`);
}
