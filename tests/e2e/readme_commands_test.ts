/**
 * The README and the docs pages with examples (tests/doc_pages.ts) as a user runs them: every
 * command line of their shell code blocks (```sh, ```bash, ```shell) is extracted and every
 * one that needs no real checkpoint is run as written, page by page in page order, from the
 * checkout (after the README's own `npm ci`), and must exit 0, or the
 * code its line declares with a trailing `# exit N`. `k3 ...` lines run through a `k3` on PATH
 * that is this checkout (README: "`k3 ...` stands for any of ..."). A `serve` line is started,
 * asked for `/v1/models`, and any later line that talks to `127.0.0.1:<its port>` runs against
 * it before it is stopped (at the latest at the end of its page: each page starts its own);
 * the port is the one free one it picks (`--port 0`), substituted into those lines. Numbers the README quotes from a command's output are checked against that
 * output. New sections' commands are picked up with no change here: the lines skipped are only
 * those below (the real checkpoint, the setup and the suite itself), and every page must
 * yield commands.
 */

import assert from "node:assert/strict";
import { ROOT, runCmd, tempDir } from "../helpers.ts";
import { EXAMPLE_PAGES, NOT_RUN, pagesWithShellBlocks, readPage } from "../doc_pages.ts";

const readme = readPage("README.md");

/** One command line of a page: its text (continuations joined) and its heading. */
interface ReadmeCommand {
  line: string;
  section: string;
}

/** Every command line of a page's shell blocks, in order. Comment lines (`# ...`, also
 * used for sample output) and blank lines are not commands. */
function readmeCommands(text: string): ReadmeCommand[] {
  const out: ReadmeCommand[] = [];
  let section = "", inBlock = false, pending = "";
  for (const raw of text.split("\n")) {
    if (!inBlock && /^#{1,6} /.test(raw)) section = raw.replace(/^#+ /, "");
    const fence = raw.match(/^```(\w*)/);
    if (fence) {
      // An opening fence of a shell block starts one; any other fence ends or skips.
      inBlock = !inBlock && ["sh", "bash", "shell"].includes(fence[1]);
      continue;
    }
    if (!inBlock) continue;
    const line = pending + raw;
    if (/\\$/.test(line)) {
      pending = line.replace(/\\$/, " ");
      continue;
    }
    // A single-quoted argument that spans lines (a JSON body): the command goes on.
    if ((line.replace(/#.*$/, "").match(/'/g)?.length ?? 0) % 2 === 1) {
      pending = line + "\n";
      continue;
    }
    pending = "";
    if (line.trim() === "" || line.trim().startsWith("#")) continue;
    out.push({ line: line.trim().replace(/ {2,}/g, " "), section });
  }
  return out;
}

/** Why a line is not run here, or undefined when it is. */
function skipReason(line: string): string | undefined {
  if (/\/data\b|\bMODEL_DIR\b|\/opt\//.test(line)) return "needs the real checkpoint or a path of the reader's";
  if (/^npm ci( |$)/.test(line) && !/&&/.test(line)) return "the setup this test runs after";
  if (/(^|&& )(npm (run )?test|deno task test)\b/.test(line)) return "the test suite itself";
  if (/\b(npm run|deno task) (compile|bench|fuzz|fixtures)\b/.test(line)) {
    return "needs the network (denort) or runs for minutes";
  }
  return undefined;
}

/** A line as run: `npm ci && X` is X (the setup has been done), ports substituted. */
function asRun(line: string, port?: number): string {
  let cmd = line.replace(/^npm ci && /, "");
  if (port !== undefined) cmd = cmd.replace(/(127\.0\.0\.1|localhost):8000/g, `127.0.0.1:${port}`);
  return cmd;
}

/** The exit code a line declares (`# exit N`), else 0. */
function expectedCode(line: string): number {
  return Number(line.match(/#\s*exit (\d+)\s*$/)?.[1] ?? 0);
}

Deno.test("README: the command extractor finds every block's lines (continuations joined, comments dropped)", () => {
  const cmds = readmeCommands(
    "## A\n```sh\nnpm run x   # c\n# out\nfoo \\\n  --bar\ncurl -d '{\n  \"a\": 1\n}'\n```\n```\nk3 usage\n```\n```json\n{}\n```\n## B\n```bash\nk3 presets\n```\n",
  );
  assert.deepEqual(cmds, [
    { line: "npm run x # c", section: "A" },
    { line: "foo --bar", section: "A" },
    { line: "curl -d '{\n \"a\": 1\n}'", section: "A" },
    { line: "k3 presets", section: "B" },
  ]);
  assert.equal(expectedCode("k3 run nope --gen 1   # exit 2"), 2);
});

Deno.test("README and docs: every page with shell blocks is run or says why not; every page run has commands", () => {
  for (const page of pagesWithShellBlocks()) {
    assert.ok(EXAMPLE_PAGES.includes(page) || NOT_RUN[page], `${page} has shell blocks: add it to tests/doc_pages.ts`);
  }
  for (const page of EXAMPLE_PAGES) assert.ok(readmeCommands(readPage(page)).length > 0, `${page}: no command found`);
});

Deno.test("README and docs: every command line that needs no real checkpoint runs as written", async () => {
  await using home = await tempDir("k3-readme-");
  // `k3` as the README uses it: this checkout, through the project's launcher.
  await Deno.mkdir(`${home.path}/bin`);
  await Deno.writeTextFile(
    `${home.path}/bin/k3`,
    `#!/bin/sh\nexec sh "${ROOT}/tools/deno" run -q --config "${ROOT}/deno.json" -P=k3 "${ROOT}/main.ts" "$@"\n`,
    { mode: 0o755 },
  );
  const denoDir = Deno.execPath().replace(/\/[^/]*$/, "");
  const systemPath = (Deno.env.get("PATH") ?? "/usr/bin:/bin").split(":").filter((d) => !d.includes("node_modules"));
  const env: Record<string, string> = {
    // A Deno user's PATH (the npm-only case is tests/e2e/wrappers_test.ts), a fresh HOME so
    // lines like `deno install --root ~/.local` stay inside the test, Deno's cache kept.
    PATH: [`${home.path}/bin`, denoDir, ...systemPath].join(":"),
    HOME: home.path,
    DENO_DIR: `${Deno.env.get("HOME")}/.cache/deno`,
    INIT_CWD: ROOT,
  };
  const ran: string[] = [], skipped: string[] = [], ranOnPage = new Map<string, number>();
  let server: { child: Deno.ChildProcess; port: number; drain: Promise<void> } | undefined;
  const stopServer = async () => {
    if (!server) return;
    server.child.kill("SIGTERM");
    await server.child.status;
    await server.drain;
    await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: server.port }), Deno.errors.ConnectionRefused);
    server = undefined;
  };
  const outputs = new Map<string, string>();
  try {
    for (const page of EXAMPLE_PAGES) {
      ranOnPage.set(page, 0);
      for (const { line, section: heading } of readmeCommands(readPage(page))) {
        const section = `${page}, ${heading}`;
        const why = skipReason(line);
        if (why) {
          skipped.push(`${line}  (${why})`);
          continue;
        }
        if (/\bserve\b/.test(line) && /tests\/fixtures\/tiny/.test(line)) {
          await stopServer();
          const cmd = asRun(line).replace(/--port \d+/, "--port 0").replace(/\s+#.*$/, "");
          const child = new Deno.Command("sh", {
            args: ["-c", `exec ${cmd}`],
            cwd: ROOT,
            env,
            stdin: "null",
            stdout: "null",
            stderr: "piped",
          }).spawn();
          const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
          let text = "", port = 0;
          while (!port) {
            const { value, done } = await reader.read();
            if (done) throw new Error(`${section}: ${line}: ended before listening: ${text}`);
            text += value;
            port = Number(text.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/)?.[1] ?? 0);
          }
          const drain = (async () => {
            while (!(await reader.read()).done);
          })();
          server = { child, port, drain };
          const models = await fetch(`http://127.0.0.1:${port}/v1/models`);
          assert.equal(models.status, 200, `${line}: GET /v1/models`);
          await models.body?.cancel();
          ran.push(line);
          ranOnPage.set(page, ranOnPage.get(page)! + 1);
          continue;
        }
        if (/127\.0\.0\.1:8000|localhost:8000/.test(line)) {
          assert.ok(server, `${section}: ${line} talks to a server no line of its page before it started`);
        }
        const cmd = asRun(line, server?.port);
        const out = await runCmd("sh", ["-c", cmd], { cwd: ROOT, env, seconds: 300 });
        assert.equal(out.code, expectedCode(line), `${section}: ${line}\n${out.stderr.slice(-2000)}`);
        assert.doesNotMatch(out.stderr, /SyntaxError|internal error|Uncaught/, `${section}: ${line}`);
        outputs.set(line, out.stdout + out.stderr);
        ran.push(line);
        ranOnPage.set(page, ranOnPage.get(page)! + 1);
      }
      await stopServer();
    }
  } finally {
    await stopServer();
  }
  assert.ok(ran.length >= 10, `ran ${ran.length} lines; skipped:\n${skipped.join("\n")}`);
  for (const [page, n] of ranOnPage) assert.ok(n > 0, `${page}: no line ran; skipped:\n${skipped.join("\n")}`);
  // The quick start's lines are all tiny-model lines: none of them may be skipped.
  for (const { line, section } of readmeCommands(readme)) {
    if (section === "Quick start" || section === "Two commands") {
      assert.ok(ran.includes(line) || /npm test/.test(line), `${section}: ${line} was run`);
    }
  }
});

Deno.test("README: the numbers it quotes from k3 presets, the demo and the bundle are what they print", async () => {
  const k3 = (args: string[]) =>
    runCmd("sh", [`${ROOT}/tools/deno`, "run", "-q", "-P=k3", `${ROOT}/main.ts`, ...args], {
      env: { K3_MEM_AVAILABLE_GB: "24" },
    });
  const presets = await k3(["presets"]);
  assert.equal(presets.code, 0, presets.stderr);
  const flat = presets.stdout.replace(/\s+/g, " ");
  // The quoted label line.
  const quoted = readme.match(/\(`(laptop +3 +1 +[\d.]+ GB free: [^`]+)`\)/);
  assert.ok(quoted, "README quotes the laptop label line");
  assert.ok(flat.includes(quoted[1].replace(/\s+/g, " ")), `${quoted[1]} in k3 presets`);
  // The presets table: pinned layers, slots and the total of each row, as k3 presets prints.
  const rows = [...readme.matchAll(/^\| (ultra|laptop|desktop|workstation|server|max) +\|[^\n]*$/gm)];
  assert.equal(rows.length, 6, "six preset rows");
  for (const [row, name] of rows) {
    const printed = presets.stdout.match(
      new RegExp(`^  ${name} +(\\d+)/93 .* (\\d+) +[\\d.]+ \\S*B .* ([\\d.]+) GB +[\\d.]+ \\S*B$`, "m"),
    );
    assert.ok(printed, `k3 presets prints ${name}`);
    const [, pinned, slots, total] = printed;
    assert.match(row, new RegExp(`\\b${pinned}/93\\b`), `${name} pinned`);
    assert.match(row, new RegExp(`\\b${slots} (expert )?slots\\b`), `${name} slots`);
    assert.match(row, new RegExp(`: ${total.replace(".", "\\.")} GB +\\|`), `${name} total ${total} GB`);
  }
  // The demo's claim: every token of the bundled model's reference.
  const reference = JSON.parse(await Deno.readTextFile(`${ROOT}/tests/fixtures/tiny-en/reference.json`));
  const n = reference.generated_ids.length;
  assert.match(readme, new RegExp(`match its tokens\\s+${n}/${n}`));
  // The bundle's size, to the tenth of a MB the README gives.
  await using dir = await tempDir();
  const bundle = await runCmd("sh", [
    `${ROOT}/tools/deno`,
    "run",
    "-q",
    "-P=compile",
    `${ROOT}/cli/bundle.ts`,
    "--output",
    `${dir.path}/k3.js`,
  ]);
  assert.equal(bundle.code, 0, bundle.stderr);
  const mb = (await Deno.stat(`${dir.path}/k3.js`)).size / 1e6;
  const said = Number(readme.match(/git-ignored, ~([\d.]+) MB/)?.[1]);
  assert.equal(said, Math.round(mb * 10) / 10, `README says ~${said} MB, the bundle is ${mb.toFixed(2)} MB`);
});
