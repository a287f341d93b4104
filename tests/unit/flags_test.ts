/**
 * Flags declared once (cli/flags.ts): every command's `--help` is the text made from its
 * flag groups; every flag the help shows is accepted and every accepted flag is in the
 * help; a group listed twice, or a flag claimed by two groups, is refused; `--threads`
 * follows one rule everywhere. In-process: no model, no child process.
 */

import assert from "node:assert/strict";
import { cli, USAGE as TOP_USAGE } from "../../cli/commands.ts";
import { type CommandFlags, commandFlags, declarationClashes, type FlagGroup } from "../../cli/flags.ts";
import { RUN_FLAGS } from "../../cli/run/options.ts";
import { CHAT_FLAGS } from "../../cli/chat/options.ts";
import { BATCH_FLAGS } from "../../cli/batch/options.ts";
import { SERVE_FLAGS } from "../../cli/serve/options.ts";
import { PACK_FLAGS } from "../../cli/pack.ts";
import { PULL_FLAGS } from "../../cli/pull/main.ts";
import { main as tokenizeMain, TOKENIZE_FLAGS } from "../../cli/tokenize.ts";
import { DETOKENIZE_FLAGS, main as detokenizeMain } from "../../cli/detokenize.ts";
import { DOCTOR_FLAGS } from "../../cli/doctor/options.ts";
import { PRESETS_FLAGS } from "../../cli/presets.ts";
import { MODEL_GROUP, threadCount } from "../../cli/flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../../cli/flag_groups/memory.ts";
import { K3Error } from "../../engine/errors.ts";

/** Every command's flags, by command name. */
const COMMANDS: Record<string, CommandFlags> = {
  run: RUN_FLAGS,
  chat: CHAT_FLAGS,
  batch: BATCH_FLAGS,
  serve: SERVE_FLAGS,
  pack: PACK_FLAGS,
  pull: PULL_FLAGS,
  tokenize: TOKENIZE_FLAGS,
  detokenize: DETOKENIZE_FLAGS,
  doctor: DOCTOR_FLAGS,
  presets: PRESETS_FLAGS,
};

/** What `k3 <cmd> --help` prints, run in-process. */
async function helpOf(cmd: string): Promise<string> {
  let printed = "";
  const out = { write: (text: string) => void (printed += text) };
  if (cmd === "tokenize") return (await tokenizeMain(["--help"], out), printed);
  if (cmd === "detokenize") return (await detokenizeMain(["--help"], out), printed);
  const log = console.log;
  console.log = (...parts: unknown[]) => void (printed += parts.join(" ") + "\n");
  try {
    assert.equal(await cli([cmd, "--help"]), 0);
  } finally {
    console.log = log;
  }
  return printed;
}

/** The flags a help text lists: each line that starts with `--name` or `-x, --name`. */
function helpFlags(help: string): { long: Set<string>; short: Set<string> } {
  const long = new Set<string>(), short = new Set<string>();
  for (const m of help.matchAll(/^ {2}(?:-(\w), )?--([\w-]+)/gm)) {
    long.add(m[2]);
    if (m[1]) short.add(m[1]);
  }
  return { long, short };
}

Deno.test("flags: the table here lists every command of k3 --help", () => {
  const listed = [...TOP_USAGE.split("commands:\n")[1].split("\n\n")[0].matchAll(/^ {2}(\w+)/gm)].map((m) => m[1]);
  assert.deepEqual(listed.sort(), Object.keys(COMMANDS).sort());
});

Deno.test("flags: k3 <cmd> --help is the usage made from the command's flag groups", async () => {
  for (const [cmd, flags] of Object.entries(COMMANDS)) {
    const help = await helpOf(cmd);
    assert.equal(help.trimEnd(), flags.usage().trimEnd(), cmd);
    assert.match(help, new RegExp(`^usage: k3 ${cmd}`), cmd);
  }
});

Deno.test("flags: every flag in a command's help is accepted, and every accepted flag is in its help", () => {
  for (const [cmd, flags] of Object.entries(COMMANDS)) {
    const shown = helpFlags(flags.usage());
    const declared = Object.keys(flags.flags);
    assert.deepEqual([...shown.long].sort(), [...declared].sort(), `${cmd}: long flags`);
    const shorts = declared.flatMap((n) => flags.flags[n].short ?? []);
    assert.deepEqual([...shown.short].sort(), shorts.sort(), `${cmd}: short flags`);
    // The parser accepts exactly those: each one shown parses, a made-up one does not.
    for (const name of shown.long) {
      const args = flags.flags[name].type === "string" ? [`--${name}`, "1"] : [`--${name}`];
      const parsed = flags.parse(args);
      assert.notEqual(parsed.values[name], undefined, `${cmd} --${name}`);
    }
    for (const s of shown.short) {
      const name = declared.find((n) => flags.flags[n].short === s)!;
      const args = flags.flags[name].type === "string" ? [`-${s}`, "1"] : [`-${s}`];
      assert.notEqual(flags.parse(args).values[name], undefined, `${cmd} -${s}`);
    }
    assert.throws(() => flags.parse(["--not-a-flag-of-k3"]), /unknown option --not-a-flag-of-k3/, cmd);
  }
});

Deno.test("flags: a group listed twice, or a flag claimed by two groups, is refused when declared", () => {
  const extra: FlagGroup = { name: "extra", title: "extra", flags: { threads: { type: "string", help: "again" } } };
  const shortClash: FlagGroup = {
    name: "clash",
    title: "",
    flags: { think: { type: "boolean", short: "t", help: "x" } },
  };
  const spec = { name: "test", head: "usage: k3 test", tail: "" };
  assert.throws(() => commandFlags({ ...spec, groups: [MODEL_GROUP, MODEL_GROUP] }), /group 'model' is listed twice/);
  assert.throws(
    () => commandFlags({ ...spec, groups: [MODEL_GROUP, extra] }),
    /--threads is declared by groups 'model' and 'extra'/,
  );
  assert.throws(() => commandFlags({ ...spec, groups: [MODEL_GROUP, shortClash] }), /-t is declared by groups/);
  assert.throws(
    () => commandFlags({ ...spec, groups: [{ name: "h", title: "", flags: { help: { type: "boolean", help: "" } } }] }),
    /--help is declared by groups 'h' and 'help'/,
  );
  // One declaration of each is fine.
  assert.ok(commandFlags({ ...spec, groups: [MODEL_GROUP, MEMORY_GROUP] }));
});

Deno.test("flags: parseUnlessHelp prints the usage and returns undefined with --help, else parses", () => {
  const printed: unknown[] = [];
  const log = console.log;
  console.log = (...args: unknown[]) => printed.push(...args);
  try {
    assert.equal(RUN_FLAGS.parseUnlessHelp(["dir", "--help"]), undefined);
    assert.deepEqual(printed, [RUN_FLAGS.usage()]);
    assert.deepEqual(RUN_FLAGS.parseUnlessHelp(["dir", "--gen", "3"])?.str("gen"), "3");
    assert.equal(printed.length, 1);
  } finally {
    console.log = log;
  }
});

Deno.test("flags: last-wins is declared by the group (memory), other flags may be given once", () => {
  const flags = commandFlags({ name: "test", head: "usage: k3 test", groups: [MODEL_GROUP, MEMORY_GROUP], tail: "" });
  const { tokens } = flags.parse(["--cache-gb", "1", "--preset", "laptop", "--cache-gb", "2"]);
  assert.equal(memoryOptions(tokens).cacheGB, 2);
  assert.throws(
    () => flags.parse(["--chunk", "8", "--chunk", "9"]),
    (e) => e instanceof K3Error && /--chunk given more than once/.test(e.message),
  );
});

Deno.test("flags: --threads is capped at the cores, the same in every command that has it", () => {
  assert.equal(threadCount(undefined, 4), 4);
  assert.equal(threadCount("2", 4), 2);
  const error = console.error;
  let said = "";
  console.error = (line: string) => void (said += line);
  try {
    assert.equal(threadCount("256", 4), 4);
  } finally {
    console.error = error;
  }
  assert.match(said, /--threads 256: this machine has 4 cores; using 4/);
  assert.throws(() => threadCount("257", 4), /out of range 1..256/);
  for (const [cmd, flags] of Object.entries(COMMANDS)) {
    if (flags.flags.threads) assert.equal(flags.flags.threads, MODEL_GROUP.flags.threads, cmd);
  }
});

Deno.test("flags: a typo names the nearest flag; a llama.cpp habit names k3's", () => {
  assert.throws(() => RUN_FLAGS.parse(["--promt", "x"]), /unknown option --promt \(did you mean --prompt\?\)/);
  assert.throws(() => CHAT_FLAGS.parse(["--temp", "1"]), /unknown option --temp \(k3 calls it --temperature\)/);
  assert.throws(() => SERVE_FLAGS.parse(["--ctx-size", "8"]), /k3 calls it --context/);
  // llama.cpp's -ngl is a memory question on a CPU, not -n (--gen); -cnv is k3 chat; --think=false is --no-think.
  assert.throws(() => RUN_FLAGS.parse(["-ngl", "99"]), /unknown option -ngl \(k3 runs on the CPU: .*--trunk-gb/);
  assert.throws(() => SERVE_FLAGS.parse(["--n-gpu-layers", "99"]), /--preset NAME .*--cache-gb/);
  assert.throws(() => RUN_FLAGS.parse(["-cnv"]), /unknown option -cnv \(a conversation is its own command: k3 chat/);
  assert.throws(() => CHAT_FLAGS.parse(["--think=false"]), /unknown option --think \(k3 calls it --no-think\)/);
});

Deno.test("flags: across every command no flag is declared twice, and a group name is one set of flags", () => {
  assert.deepEqual(declarationClashes(Object.values(COMMANDS)), []);
  // A made-up second "memory" group (another concern's flags under the same name) and a
  // made-up group copying --threads's declaration are both named.
  const spec = { name: "made-up", head: "usage: k3 made-up", tail: "" };
  const secondMemory: FlagGroup = { name: "memory", title: "", flags: { "ram-gb": { type: "string", help: "x" } } };
  const threadsAgain: FlagGroup = { name: "workers", title: "", flags: { threads: { ...MODEL_GROUP.flags.threads } } };
  const madeUp = commandFlags({ ...spec, groups: [secondMemory, threadsAgain] });
  assert.deepEqual(declarationClashes([...Object.values(COMMANDS), madeUp]).sort(), [
    "--threads is declared alike by groups 'model' and 'workers'",
    "group 'memory' declares other flags in k3 made-up than in k3 run",
  ]);
});
