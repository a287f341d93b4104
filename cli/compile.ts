/**
 * `deno task compile`: builds the one-file `./k3` with `deno compile`, the kernel library
 * embedded, and only the permissions k3 needs.
 *
 * `deno compile` starts from Deno's `denort` runtime, which it downloads unless
 * `DENORT_BIN=/path/to/denort` points at a copy (offline builds). The runtime must be the
 * same version as this Deno (see `node_modules/.bin/deno --version`).
 *
 *     deno task compile                          # ./k3
 *     DENORT_BIN=/opt/denort deno task compile   # offline
 *     deno task compile --output /usr/local/bin/k3
 *
 * The binary is built under a temporary name, run once with `--version`, and renamed into
 * place only if it prints k3's version: a runtime that is not denort (e.g. DENORT_BIN
 * pointing at the deno binary itself) yields a file that runs plain Deno, and that is a
 * failed build, not a k3.
 *
 * @module
 */

import { WEB_FILES } from "./server/web.ts";
import { VERSION } from "./version.ts";
import { K3_PERMISSIONS } from "./permissions.ts";

/** Permissions of the compiled k3, the deno.json permission set "k3": files (models,
 * outputs, the library cache), its own environment variables, the kernel library, and free
 * disk space for `k3 doctor`, and the network for `k3 serve`'s listener. No subprocesses. */
export const PERMISSIONS: string[] = K3_PERMISSIONS;

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const EXT = Deno.build.os === "darwin" ? "dylib" : Deno.build.os === "windows" ? "dll" : "so";

/** Files deno compile cannot find by following imports: the native kernel library, the
 * per-ISA builds this machine could make (the binary picks what the running CPU supports,
 * engine/native/libpath.ts), the compute worker and the chat page. Missing ones are skipped. */
export const INCLUDES = [
  `kernels/build/libk3.${EXT}`,
  ...["avx512", "avx2", "scalar"].map((v) => `kernels/build/libk3-${v}.${EXT}`),
  "engine/native/pool_worker.ts",
  ...WEB_FILES.map((f) => `cli/web/${f}`),
];

/** The deno compile argument list. */
export function compileArgs(output: string): string[] {
  const includes = INCLUDES.filter((f) => {
    try {
      return Deno.statSync(`${ROOT}/${f}`).isFile;
    } catch {
      return false;
    }
  });
  // --no-npm: k3 imports no npm package (npm only brings Deno and test-time packages), so
  // node_modules stays out of the binary.
  return [
    "compile",
    "--no-check",
    "--no-npm",
    "--output",
    output,
    ...PERMISSIONS,
    ...includes.flatMap((f) => ["--include", f]),
    "main.ts",
  ];
}

/** True when deno compile failed because it could not fetch denort. */
export function isDenortFailure(stderr: string): boolean {
  return /denort|Setting up base binary|dl\.deno\.land/i.test(stderr);
}

/** Runs `bin --version`: true when it prints this k3's version, else what went wrong. */
export async function proveBinary(bin: string): Promise<true | string> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command(bin, { args: ["--version"], stdout: "piped", stderr: "piped" }).output();
  } catch (e) {
    return `running ${bin} --version failed: ${(e as Error).message}`;
  }
  const text = new TextDecoder().decode(out.stdout).trim();
  if (out.success && text === `k3 ${VERSION}`) return true;
  return `${bin} --version printed ${JSON.stringify(text.split("\n")[0])} (exit ${out.code}), not "k3 ${VERSION}"` +
    " (was DENORT_BIN a real denort of this Deno's version?)";
}

async function main(args: string[]): Promise<number> {
  let output = "k3";
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--output" || args[i] === "-o") output = args[++i];
    else {
      console.error(
        `compile: unknown argument ${JSON.stringify(args[i])} (usage: deno task compile [--output PATH])`,
      );
      return 2;
    }
  }
  if (!output) {
    console.error("compile: --output needs a path");
    return 2;
  }
  const denort = Deno.env.get("DENORT_BIN");
  if (denort) {
    try {
      Deno.statSync(denort);
    } catch {
      console.error(`compile: DENORT_BIN=${denort} does not exist`);
      return 1;
    }
  }
  const make = await new Deno.Command("make", {
    args: ["-s", "-C", "kernels", "all", "variants"],
    cwd: ROOT,
  })
    .output();
  if (!make.success) {
    console.error("compile: building the kernel library failed (make -C kernels all variants)");
    await Deno.stderr.write(make.stderr);
    return 1;
  }
  const tmp = `${output}.tmp-${Deno.pid}`;
  const args2 = compileArgs(tmp);
  console.error(`compile: ${Deno.execPath()} ${args2.join(" ")}`);
  const out = await new Deno.Command(Deno.execPath(), {
    args: args2,
    cwd: ROOT,
    stdout: "inherit",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  if (!out.success) {
    if (isDenortFailure(stderr) && !denort) {
      const v = Deno.version.deno;
      console.error(
        `compile: deno compile needs Deno's runtime "denort" ${v}, and downloading it failed (offline?).\n` +
          `  Get denort-${Deno.build.target}.zip for v${v} from a machine with access (Deno's release downloads),\n` +
          `  unzip it here, and run:  DENORT_BIN=$PWD/denort npm run compile`,
      );
      const first = stderr.split("\n").find((l) => /error/i.test(l));
      // deno-lint-ignore no-control-regex
      if (first) console.error(`  (deno said: ${first.replace(/\x1b\[[0-9;]*m/g, "").trim()})`);
    } else {
      await Deno.stderr.write(out.stderr);
    }
    return 1;
  }
  await Deno.stderr.write(out.stderr);
  const built = await proveBinary(tmp.includes("/") ? tmp : `./${tmp}`);
  if (built !== true) {
    await Deno.remove(tmp).catch(() => {});
    console.error(`compile: the built binary is not k3: ${built}; nothing written`);
    return 1;
  }
  await Deno.rename(tmp, output);
  console.error(
    `compile: wrote ${output} (its --version prints k3 ${VERSION}); try: ${
      output.includes("/") ? output : `./${output}`
    } --help`,
  );
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
