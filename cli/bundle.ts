/**
 * `deno task bundle`: writes dist/k3.js, the whole CLI as one JavaScript file, with `deno
 * bundle`. Inside it: every kernel library build `make -C kernels all variants` made here
 * (base64) and the compute worker (bundled separately, embedded as source), registered by
 * the bundle's first module (engine/native/embedded.ts). At start-up the library is chosen
 * and extracted by the loader the compiled binary uses (engine/native/libpath.ts).
 *
 *     deno task bundle                      # dist/k3.js
 *     deno task bundle --output /opt/k3.js
 *     deno run --allow-read --allow-write --allow-ffi --allow-sys=statfs \
 *       --allow-env=K3_LIB,... dist/k3.js run MODEL_DIR --prompt hi
 *
 * The file is built under a temporary name, run once with `--version`, and renamed into
 * place only when that prints k3's version.
 *
 * @module
 */

import { VERSION } from "./version.ts";
import { INCLUDES } from "./compile.ts";
import { K3_PERMISSIONS } from "./permissions.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const dec = new TextDecoder();

/** Base64 of `bytes` (chunked: String.fromCharCode takes a bounded argument list). */
function base64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

async function run(cmd: string, args: string[]): Promise<{ ok: boolean; stdout: string; stderr: string }> {
  const out = await new Deno.Command(cmd, { args, cwd: ROOT, stdout: "piped", stderr: "piped" }).output();
  return { ok: out.success, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** The deno run command line documented for the bundle (narrow permissions), through the
 * checkout's launcher: after `npm ci` alone no `deno` is on PATH. */
export function bundleCommand(file: string): string {
  return `tools/deno run ${K3_PERMISSIONS.join(" ")} ${file}`;
}

async function main(args: string[]): Promise<number> {
  let output = "dist/k3.js";
  for (let i = 0; i < args.length; i++) {
    if ((args[i] === "--output" || args[i] === "-o") && args[i + 1]) output = args[++i];
    else {
      console.error(`bundle: unknown argument ${JSON.stringify(args[i])} (usage: deno task bundle [--output PATH])`);
      return 2;
    }
  }
  if (!output.startsWith("/")) output = `${Deno.env.get("INIT_CWD") ?? ROOT}/${output}`;
  const make = await run("make", ["-s", "-C", "kernels", "all", "variants"]);
  if (!make.ok) {
    console.error(`bundle: building the kernel library failed (make -C kernels all variants)\n${make.stderr}`);
    return 1;
  }
  const work = await Deno.makeTempDir({ prefix: "k3-bundle-" });
  try {
    // The worker first: its own bundle, embedded as text and started from a blob: URL.
    const worker = await run(Deno.execPath(), [
      "bundle",
      "--quiet",
      "--platform",
      "deno",
      "-o",
      `${work}/worker.js`,
      `${ROOT}/engine/native/pool_worker.ts`,
    ]);
    if (!worker.ok) {
      console.error(`bundle: bundling the compute worker failed\n${worker.stderr}`);
      return 1;
    }
    const libraries: Record<string, string> = {};
    for (const f of INCLUDES.filter((f) => f.startsWith("kernels/build/"))) {
      try {
        libraries[f.slice("kernels/build/".length)] = base64(await Deno.readFile(`${ROOT}/${f}`));
      } catch { /* a variant this machine could not build */ }
    }
    // The chat page's files, as text (cli/server/web.ts serves them from here in a bundle).
    const web: Record<string, string> = {};
    for (const f of INCLUDES.filter((f) => f.startsWith("cli/web/"))) {
      web[f.slice("cli/web/".length)] = await Deno.readTextFile(`${ROOT}/${f}`);
    }
    const embedded = `${ROOT}/engine/native/embedded.ts`;
    await Deno.writeTextFile(
      `${work}/data.ts`,
      `import { embed } from ${JSON.stringify(`file://${embedded}`)};\n` +
        `embed(${JSON.stringify({ libraries, workerSource: await Deno.readTextFile(`${work}/worker.js`), web })});\n`,
    );
    // Modules evaluate in import order, so the data is registered before the commands
    // load; the entry calls cli itself (what main.ts does when run).
    await Deno.writeTextFile(
      `${work}/entry.ts`,
      `import "./data.ts";\nimport { cli } from ${JSON.stringify(`file://${ROOT}/cli/commands.ts`)};\n` +
        "Deno.exit(await cli(Deno.args));\n",
    );
    await Deno.mkdir(output.slice(0, output.lastIndexOf("/")) || "/", { recursive: true });
    const tmp = `${output}.tmp-${Deno.pid}`;
    const b = await run(Deno.execPath(), ["bundle", "--quiet", "--platform", "deno", "-o", tmp, `${work}/entry.ts`]);
    if (!b.ok) {
      await Deno.remove(tmp).catch(() => {});
      console.error(`bundle: deno bundle failed\n${b.stderr}`);
      return 1;
    }
    const v = await run(Deno.execPath(), ["run", ...K3_PERMISSIONS, tmp, "--version"]);
    if (!v.ok || v.stdout.trim() !== `k3 ${VERSION}`) {
      if (!Deno.env.get("K3_KEEP")) await Deno.remove(tmp).catch(() => {});
      console.error(
        `bundle: the bundle does not run as k3 (--version: ${JSON.stringify(v.stdout.trim())}, ${v.stderr.trim()})`,
      );
      return 1;
    }
    await Deno.rename(tmp, output);
    const size = (await Deno.stat(output)).size;
    console.error(
      `bundle: wrote ${output} (${(size / 1e6).toFixed(2)} MB; ${
        Object.keys(libraries).join(", ")
      } and the worker embedded; ` +
        `--version prints k3 ${VERSION})\n  run it: ${bundleCommand(output)} --help`,
    );
    return 0;
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
