/**
 * The wrappers a user types after the README's setup (`npm ci`): `deno task X` and `npm run X`
 * both work, with a Deno on PATH or only the npm one, and a signal sent to the wrapper reaches
 * k3 (the server closes its port).
 */

import assert from "node:assert/strict";
import { ROOT, runCmd, TINY } from "../helpers.ts";

/** PATH without the npm one's directory (node_modules/.bin), so `deno` is what the user has. */
const PATH_NO_NPM_DENO = (Deno.env.get("PATH") ?? "").split(":").filter((d) => !d.includes("node_modules")).join(":");
const NPM_DENO_DIR = `${ROOT}/node_modules/.bin`;
const PATHS: [string, string][] = [
  ["only the npm Deno", PATH_NO_NPM_DENO],
  ["a Deno on PATH", `${Deno.execPath().replace(/\/[^/]*$/, "")}:${PATH_NO_NPM_DENO}`],
];

/** `deno task ...` as typed: with only the npm Deno that is `npx deno task ...`. */
function denoTask(path: string, args: string[]): [string, string[]] {
  return path.includes(ROOT) ? ["deno", ["task", "-q", ...args]] : ["npx", ["deno", "task", "-q", ...args]];
}

for (const [label, path] of PATHS) {
  Deno.test(`deno task and npm run, ${label}: k3 --version and demo`, async () => {
    const env = { PATH: path, INIT_CWD: ROOT };
    const [cmd, args] = denoTask(path, ["k3", "--version"]);
    const version = await runCmd(cmd, args, { env });
    assert.equal(version.code, 0, version.stderr);
    assert.match(version.stdout, /^k3 \d+\.\d+\.\d+\n$/);
    assert.doesNotMatch(version.stderr, /SyntaxError/);
    const npmVersion = await runCmd("npm", ["run", "-s", "k3", "--", "--version"], { env });
    assert.equal(npmVersion.code, 0, npmVersion.stderr);
    assert.equal(npmVersion.stdout, version.stdout);
    const [dcmd, dargs] = denoTask(path, ["demo"]);
    for (const [c, a] of [[dcmd, dargs], ["npm", ["run", "-s", "demo"]]] as const) {
      const demo = await runCmd(c, [...a], { env });
      assert.equal(demo.code, 0, `${c} ${a.join(" ")}: ${demo.stderr}`);
      assert.match(demo.stderr, /resident run: (\d+)\/\1 tokens equal the reference/);
    }
  });
}

/** Starts `cmd args` (a wrapper running `k3 serve --port 0`), returns it and the port k3 printed. */
async function startServe(cmd: string, args: string[], env: Record<string, string>) {
  const child = new Deno.Command(cmd, { args, env, cwd: ROOT, stdin: "null", stdout: "null", stderr: "piped" })
    .spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`${cmd} ${args.join(" ")} ended before listening: ${text}`);
    text += value;
    const m = text.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) return { child, reader, port: Number(m[1]) };
  }
}

for (
  const [label, cmd, args] of [
    ["npm run k3", "npm", ["run", "-s", "k3", "--", "serve", TINY, "--port", "0"]],
    ["deno task k3", "deno", ["task", "-q", "k3", "serve", TINY, "--port", "0"]],
  ] as const
) {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    Deno.test(`${label} serve, the wrapper sent ${signal}: k3 stops and the port closes`, async () => {
      const env = { PATH: `${NPM_DENO_DIR}:${PATH_NO_NPM_DENO}`, INIT_CWD: ROOT };
      const { child, reader, port } = await startServe(cmd, [...args], env);
      const before = await Deno.connect({ hostname: "127.0.0.1", port });
      before.close();
      child.kill(signal);
      await child.status;
      // stderr ends when every process holding it (k3 included) has exited.
      while (!(await reader.read()).done);
      await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port }), Deno.errors.ConnectionRefused);
    });
  }
}

Deno.test("tools/k3 linked onto PATH runs this checkout with only the npm Deno (no deno on PATH)", async () => {
  const bin = await Deno.makeTempDir();
  try {
    await Deno.symlink(`${ROOT}/tools/k3`, `${bin}/k3`);
    const env = { PATH: `${bin}:${PATH_NO_NPM_DENO}` };
    const which = await runCmd("sh", ["-c", "command -v deno || echo none"], { env });
    assert.equal(which.stdout.trim(), "none", "no deno on this PATH");
    const out = await runCmd("k3", ["run", TINY, "--prompt", "Hello", "--gen", "2", "--quiet"], { env, cwd: bin });
    assert.equal(out.code, 0, out.stderr);
    assert.ok(out.stdout.length > 0);
  } finally {
    await Deno.remove(bin, { recursive: true });
  }
});
